/* launcher/web_page.S — the live page (launcher/web/index.html) inside bmlaunch.
 * collector_page is the file's bytes and a NUL; collector_page_end follows it. */
    .section .rodata
    .global collector_page
    .hidden collector_page
    .type collector_page, @object
collector_page:
    .incbin "launcher/web/index.html"
    .byte 0
    .global collector_page_end
    .hidden collector_page_end
collector_page_end:
    .section .note.GNU-stack,"",@progbits
