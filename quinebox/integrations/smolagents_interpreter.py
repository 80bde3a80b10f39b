"""The in-box side of smolagents' QuineboxExecutor: one Python process that runs a CodeAgent's actions, its state kept.

Not imported on the host: its source is given to the box's own `python3 -c SOURCE CAP SITE`, so it is standard
library only and runs on any Python 3.8+ an image has. It reads requests on stdin and answers on stdout, each
`LENGTH\\n` then that many bytes of JSON; once started it points fds 0, 1 and 2 elsewhere (stdin at /dev/null, the
output of an action at a memfd of its own), so neither an action's prints nor its children's can reach the answers.
Everything lives inside `main`, which takes itself out of the namespace before the first action: the actions run
in __main__'s namespace (what they define pickles as a script's would) and find nothing of this there to break.

    request:  {"op": "run", "code": ..., "timeout": seconds | null}   or   {"op": "refresh"} (after a pip install)
    answer:   {"kind": "hello"} once; then per request {"kind": "none" | "value" | "error" | "final", "logs": ..., ...}
"""


def main(cap_text: str, site: str) -> None:
    """Serve requests until stdin ends: `cap_text`, the bytes of an action's output kept (its head and tail, half
    each), also bounds a value's and a traceback's text; `site`, where pip puts what it installs, goes on sys.path."""
    import ast
    import io
    import json
    import linecache
    import os
    import signal
    import sys
    import traceback

    globals().pop("main", None)
    cap = int(cap_text)
    names = globals()
    sys.path.append(site)
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    # Unbuffered at the fd: an action's prints and its children's output land in the order they were made.
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)

    class Interrupted(TimeoutError):
        pass

    Interrupted.__qualname__ = "Interrupted"

    def alarm(signum, frame):
        raise Interrupted("the code action ran longer than its timeout and was interrupted; its variables so far are kept")

    signal.signal(signal.SIGALRM, alarm)

    def send(message):
        data = json.dumps(message).encode()
        data = b"%d\n" % len(data) + data
        while data:
            data = data[os.write(answers, data):]

    def read(fd, start, length):
        os.lseek(fd, start, os.SEEK_SET)
        chunks = []
        while length > 0:
            chunk = os.read(fd, min(length, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            length -= len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")

    def captured(fd):
        """What the action wrote, its head and tail where it wrote more than `cap` bytes."""
        size = os.lseek(fd, 0, os.SEEK_END)
        if size <= cap:
            return read(fd, 0, size)
        half = cap // 2
        return read(fd, 0, half) + f"\n...[{size - 2 * half} bytes of output left out]...\n" + read(fd, size - half, half)

    def shown(value):
        """The value itself where it is plain JSON (as smolagents' local executor gives it), else its repr."""
        try:
            text = json.dumps(value)
            if len(text) <= cap and json.loads(text) == value:
                return {"kind": "value", "json": value}
        except (TypeError, ValueError, RecursionError):
            pass
        try:
            text = repr(value)
        except BaseException as error:  # noqa: BLE001 - the action's own repr may raise anything; the answer still goes
            text = f"<repr failed: {type(error).__name__}>"
        return {"kind": "value", "repr": text[:cap]}

    def failed(error):
        """The exception's name, text and traceback: the action's own frames (and what they called), not ours."""
        frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename != "<string>"]
        ours = [i for i, frame in enumerate(frames) if frame.filename.startswith("<action ")]
        frames = frames[ours[0]:] if ours else []
        where = ("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))) if frames else ""
        try:
            text = str(error)
        except BaseException:  # noqa: BLE001 - as repr above
            text = "<str failed>"
        said = where + "".join(traceback.format_exception_only(type(error), error))
        return {"kind": "error", "name": type(error).__name__, "value": text[:cap], "traceback": said[-cap:]}

    def run(code, name, timeout):
        try:
            tree = ast.parse(code, name, "exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            linecache.cache[name] = (len(code), None, code.splitlines(True), name)  # the traceback shows the action's lines
            if timeout:
                signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                exec(compile(tree, name, "exec"), names)
                value = eval(compile(ast.Expression(last.value), name, "eval"), names) if isinstance(last, ast.Expr) else None
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            return {"kind": "none"} if value is None else shown(value)
        except BaseException as error:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: the interpreter outlives its actions
            final = getattr(error, "value", None)
            if type(error).__name__ == "FinalAnswerException" and isinstance(final, str):
                return {"kind": "final", "value": final}  # smolagents' patched final_answer: "safe:JSON" or "pickle:..."
            return failed(error)

    send({"kind": "hello", "python": sys.version.split()[0]})
    count = 0
    while True:
        header = requests.readline()
        if not header:
            return
        request = json.loads(requests.read(int(header)))
        if request.get("op") == "refresh":
            import importlib

            sys.path_importer_cache.clear()
            importlib.invalidate_caches()
            send({"kind": "none"})
            continue
        count += 1
        out = os.memfd_create("action-output") if hasattr(os, "memfd_create") else os.open(os.environ.get("TMPDIR", "/tmp"), os.O_RDWR | os.O_TMPFILE)
        os.dup2(out, 1)
        os.dup2(out, 2)
        answer = run(request["code"], f"<action {count}>", request.get("timeout"))
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - an action may have closed or replaced them; its answer still goes
                pass
        os.dup2(null, 1)
        os.dup2(null, 2)
        answer["logs"] = captured(out)
        os.close(out)
        send(answer)


if __name__ == "__main__":
    main(*__import__("sys").argv[1:3])
