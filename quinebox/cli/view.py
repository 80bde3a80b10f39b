"""`quinebox view`: a live web page of sessions, process trees, transcripts, worlds, runs and the audit log (quinebox[view])."""

from __future__ import annotations

import typer

from quinebox.cli.app import app, reported, say

MISSING = "the view needs its extra ({name} is missing): pip install 'quinebox[view]'"


@app.command(
    "view",
    help="Serve a live web view on loopback and print its URL (token included): sessions, each tree of boxes and agents, "
    "transcripts, worlds, map/batch runs, the audit log and requests waiting for a person. --export DIR writes it as static files instead.",
)
def view_command(
    session: str | None = typer.Argument(None, help="Open at this session's tree (or, with --export, export only its tree)."),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="The port (default 0: a free one, printed)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Where to listen; anything beyond loopback is warned about."),
    open_browser: bool = typer.Option(False, "--open", help="Open the URL in a browser too."),
    allow_approve: bool = typer.Option(False, "--allow-approve", help="Let the page approve or deny waiting requests (audited as any decision)."),
    export_dir: str | None = typer.Option(None, "--export", metavar="DIR", help="Write the views as a static bundle to DIR (no server), e.g. for CI artifacts."),
) -> None:
    try:
        from quinebox.view.export import export
        from quinebox.view.serve import serve
    except ImportError as exc:
        say(MISSING.format(name=exc.name))
        raise typer.Exit(2) from None
    if export_dir is not None:
        if allow_approve or open_browser or port:
            say("--export writes files and serves nothing: drop --allow-approve, --open and --port")
            raise typer.Exit(2)
        with reported():
            try:
                counts = export(export_dir, session)
            except KeyError:
                from quinebox.agent.store import Index
                from quinebox.agent.tapes import missing

                index = Index()
                say(missing(index, session or ""))
                index.close()
                raise typer.Exit(1) from None
            except OSError as exc:
                say(f"cannot write the bundle to {export_dir}: {exc.strerror or exc}")
                raise typer.Exit(1) from None
        say(f"wrote {export_dir}/index.html: {counts['sessions']} session(s), {counts['runs']} run(s); open it in a browser")
        return
    if session is not None:
        from quinebox.agent.tapes import find

        with reported():
            session = find(session).id
    try:
        serve(host=host, port=port, session=session, allow_approve=allow_approve, open_browser=open_browser)
    except OSError as exc:
        say(str(exc.strerror or exc) + "; choose another --port, or 0 for a free one")
        raise typer.Exit(125) from None
    except KeyboardInterrupt:
        pass
