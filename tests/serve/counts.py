"""What the statistics extension counts, read the way the end-to-end tests read it."""

from __future__ import annotations

import tritonclient.http as httpclient


def successes(client: httpclient.InferenceServerClient, model: str) -> int:
    """Successful requests of ``model``, summed over the versions the server lists."""
    stats = client.get_inference_statistics(model)["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)
