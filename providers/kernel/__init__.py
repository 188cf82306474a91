"""The router's own code kernel, for providers whose sandboxes have none.

`program` is what runs inside the sandbox (standard library only, sent to
it on the kernel's stdin); `host` starts it per code context, frames the
requests and answers, and restarts it when it ends.
"""
