"""What the statistics extension counts, read the way the end-to-end tests read it."""

from __future__ import annotations

import re

import tritonclient.http as httpclient


def successes(client: httpclient.InferenceServerClient, model: str) -> int:
    """Successful requests of ``model``, summed over the versions the server lists."""
    stats = client.get_inference_statistics(model)["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def metric(text: str, family: str, model: str, extra: str = "") -> float | None:
    """The value of ``family`` for version 1 of ``model`` in Triton's ``/metrics`` text (``extra``: more
    labels before ``version``, each as ``name="value",``); None where the line is missing."""
    labels = f'model="{model}",{extra}version="1"'
    match = re.search(rf"^{family}\{{{re.escape(labels)}\}} (\S+)$", text, re.MULTILINE)
    return None if match is None else float(match.group(1))
