"""Run a job in a child process, so a kernel that faults or hangs ends that job, not convlab.

An illegal address or a trap leaves the process's CUDA context unusable, and a hung kernel
never returns. Kernel files therefore run in a child: the parent never creates a CUDA context
for them, and gets back a JSON record whatever happens.

The protocol (generic over any importable function taking and returning JSON-able values):

- The parent runs `python -m convlab.gpu.isolate` (behind an optional command prefix such as
  compute-sanitizer) in a new process group, writes one JSON request to its stdin,
  {"function": "package.module:function", "args": {...}}, and passes it a pipe whose file
  descriptor number is in the environment variable CONVLAB_ISOLATE_FD.
- The child calls function(**args) and writes JSON lines to that pipe: {"wait": "begin"} and
  {"wait": "end"} around every wait on the device (`gpu_wait()`; timer.time_device and the
  guard use it), then {"result": value} or {"error": {"type": ..., "message": ...}}.
- The parent kills the process group when one device wait lasts longer than `timeout_s` (a
  hang: a kernel that never finishes) or the whole job longer than `limit_s`. Compilation and
  float64 references on the CPU are not device waits, so a short `timeout_s` does not cut them.
- run_isolated returns {"status": "ok" | "error" | "hang" | "timeout" | "crash", "result":
  the function's value or None, "reason": one line for a FAIL row, "wall_s", "returncode",
  "stdout", "stderr"} (stdout and stderr cut to their last OUTPUT_LIMIT characters); with
  status "error" also "message" (the exception's whole message), "user_error" (whether it is a
  ConvlabError: a problem the user can act on, such as a compile error, not a failed kernel)
  and "traceback".

The child writes nothing but this record: a job must not save results itself, so a job that
dies leaves nothing partial behind.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Sequence

from ..errors import ConvlabError

FD_VARIABLE = "CONVLAB_ISOLATE_FD"
DEFAULT_TIMEOUT_S = 5.0  # longest device wait: no conv launch of convlab's takes near this
DEFAULT_LIMIT_S = 900.0
OUTPUT_LIMIT = 200_000

_channel = None  # the child's end of the pipe, while running as an isolated child


def _send(message: dict) -> None:
    if _channel is not None:
        _channel.write(json.dumps(message) + "\n")
        _channel.flush()


@contextlib.contextmanager
def gpu_wait():
    """Mark a wait on the device; in an isolated child the parent times it. No-op otherwise."""
    _send({"wait": "begin"})
    try:
        yield
    finally:
        _send({"wait": "end"})


def _resolve(path: str):
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"function path {path!r} should read 'package.module:function'")
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def _child() -> int:
    """Entry point of `python -m convlab.gpu.isolate`."""
    global _channel
    _channel = os.fdopen(int(os.environ[FD_VARIABLE]), "w")
    try:
        request = json.loads(sys.stdin.read())
        value = _resolve(request["function"])(**request.get("args", {}))
        message = {"result": value}
        json.dumps(message)  # a value that cannot cross is the job's error, reported as such
    except BaseException as exc:  # noqa: BLE001 - every failure crosses back as a record
        message = {"error": {"type": type(exc).__name__, "message": str(exc).strip(),
                             "user_error": isinstance(exc, ConvlabError),
                             "traceback": traceback.format_exc(limit=8)}}
    _send(message)
    _channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # A faulted CUDA context can make interpreter shutdown hang or crash: leave at once.
    os._exit(0)


def _tail(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - OUTPUT_LIMIT))
        return f.read().decode(errors="replace")


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by sigterm_interrupts."""


def stop_status(stop: KeyboardInterrupt) -> int:
    """The shell's exit status for a run `stop` ended: 143 for SIGTERM, 130 for Ctrl-C."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


@contextlib.contextmanager
def sigterm_interrupts():
    """SIGTERM (`timeout`, a batch scheduler) raises Terminated, a KeyboardInterrupt as Ctrl-C
    raises, so that a long measurement (compare, tune) can stop with what it has instead of
    dying with it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_isolated(function: str, args: dict | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 limit_s: float = DEFAULT_LIMIT_S, prefix: Sequence[str] = (),
                 env: dict | None = None) -> dict:
    """Run function(**args) in a child process (see the module's protocol) and return its record."""
    request = json.dumps({"function": function, "args": args or {}})
    read_fd, write_fd = os.pipe()
    child_env = dict(os.environ if env is None else env)
    child_env[FD_VARIABLE] = str(write_fd)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="convlab-isolate-") as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([*prefix, sys.executable, "-m", "convlab.gpu.isolate"],
                                    stdin=subprocess.PIPE, stdout=out, stderr=err,
                                    pass_fds=(write_fd,), env=child_env, start_new_session=True)
        try:
            os.close(write_fd)
            proc.stdin.write(request.encode())
            proc.stdin.close()
            status, reason, message = _watch(proc, read_fd, start, timeout_s, limit_s)
        except BaseException:
            # Ctrl-C or SIGTERM here: the child, in a session of its own, would not see it
            # and would go on holding the GPU.
            _kill(proc)
            raise
        finally:
            os.close(read_fd)
        returncode = proc.wait()
        stdout, stderr = _tail(out_path), _tail(err_path)
    record = {"status": status, "result": None, "reason": reason, "wall_s": time.monotonic() - start,
              "returncode": returncode, "stdout": stdout, "stderr": stderr}
    if message is not None and "result" in message:
        record["status"], record["result"] = "ok", message["result"]
    elif message is not None and "error" in message:
        error = message["error"]
        record["status"] = "error"
        record["reason"] = f"{error['type']}: {error['message']}".splitlines()[0]
        record["message"] = error["message"]
        record["user_error"] = error.get("user_error", False)
        record["traceback"] = error.get("traceback", "")
    elif status == "crash":
        last = [line for line in stderr.splitlines() if line.strip()][-1:] or ["no output"]
        how = f"signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
        record["reason"] = f"the child process died ({how}) without a result: {last[0]}"
    return record


def _watch(proc, read_fd: int, start: float, timeout_s: float, limit_s: float):
    """Read the child's messages until it finishes, hangs in a device wait, or runs too long."""
    buffer, message, waiting_since = b"", None, None
    while True:
        now = time.monotonic()
        deadline = start + limit_s
        if waiting_since is not None:
            deadline = min(deadline, waiting_since + timeout_s)
        ready, _, _ = select.select([read_fd], [], [], max(0.0, min(deadline - now, 1.0)))
        if ready:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                return ("crash", "", message) if message is None else ("ok", "", message)
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                item = json.loads(line)
                if item.get("wait") == "begin":
                    waiting_since = time.monotonic()
                elif item.get("wait") == "end":
                    waiting_since = None
                else:
                    message = item
            continue
        now = time.monotonic()
        if waiting_since is not None and now - waiting_since >= timeout_s:
            _kill(proc)
            return ("hang", f"hang: a device wait did not finish within {timeout_s:g} s (a kernel "
                            "that never returns?); the process was killed", None)
        if now - start >= limit_s:
            _kill(proc)
            return ("timeout", f"the job did not finish within {limit_s:g} s; the process was "
                               "killed", None)


if __name__ == "__main__":
    # Run as convlab.gpu.isolate, not __main__, so that jobs' gpu_wait() reaches this channel.
    from .isolate import _child as child

    sys.exit(child())
