"""What the engine holds of quinebox's boxes, as the tests look at it."""

from types import SimpleNamespace


def live_boxes(engine, label: str = "io.quinebox.session") -> list:
    """quinebox's containers as (status, labels) records, from one list call.

    docker-py's high-level list inspects each container afterwards, which
    races with boxes being removed: exactly what these tests watch for.
    """
    return [SimpleNamespace(status=c["State"], labels=c["Labels"], id=c["Id"]) for c in engine.api.containers(all=True, filters={"label": label})]
