"""A command on a terminal of its own, as Modal runs an exec that carries ``pty_info``.

Modal's SDK asks for a PTY with ``TaskExecStart.pty_info`` (``exec(..., pty=True)``)
and then speaks to the exec as to any other: stdin written by offset, the
output read from stdout (the terminal merges stderr into it). The emulator's
execs are pipes, so it runs this stdlib-only script with the sandbox's Python
as ``python3 -c <this file> <rows> <cols> <argv...>``: it starts the command
on a new PTY of that size (unchanged when Modal sends 0 x 0, the size of a
caller without a tty), as the session leader with the terminal as its
controlling tty; it copies stdin to the terminal and the terminal to stdout,
and exits as the command did (by its signal too).
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import sys
import termios


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _start(rows: int, cols: int, argv: list[str]) -> tuple[int, int]:
    pid, terminal = pty.fork()
    if pid == 0:
        try:
            if rows or cols:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"{argv[0]}: {exc.strerror}\r\n".encode())
        os._exit(127)
    return pid, terminal


def _relay(terminal: int) -> None:
    readers = [0, terminal]
    while terminal in readers:
        for fd in select.select(readers, [], [])[0]:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the terminal's last user has gone
                data = b""
            if fd == terminal:
                if data:
                    _write_all(1, data)
                else:
                    readers.remove(terminal)
            elif data:
                _write_all(terminal, data)
            else:
                readers.remove(0)


def main() -> None:
    rows, cols, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    pid, terminal = _start(rows, cols, argv)
    _relay(terminal)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code < 0:
        if -code != signal.SIGKILL:  # the one signal whose handler cannot be set
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
