"""What the engine holds of quinebox's boxes, as the tests look at it."""

from types import SimpleNamespace

from quinebox.box.claim import claimed_as
from quinebox.box.policy import LABEL_OWNER, LABEL_PARENT, LABEL_SESSION
from quinebox.box.shape import LABEL_POOL


def live_boxes(engine, label: str = "io.quinebox.session") -> list:
    """quinebox's containers as (status, labels) records, from one list call.

    docker-py's high-level list inspects each container afterwards, which
    races with boxes being removed: exactly what these tests watch for.
    A command server's warm boxes are left out until claimed; a claimed one
    carries the labels its claim record gives it, as `quinebox ps` shows it.
    """
    boxes = []
    for container in engine.api.containers(all=True, filters={"label": label}):
        labels = container["Labels"]
        if LABEL_POOL in labels:
            record = claimed_as(container["Id"])
            if record is None:
                continue
            labels = {**labels, LABEL_SESSION: record["session"], LABEL_OWNER: record["owner"], LABEL_PARENT: record["parent"]}
        boxes.append(SimpleNamespace(status=container["State"], labels=labels, id=container["Id"]))
    return boxes
