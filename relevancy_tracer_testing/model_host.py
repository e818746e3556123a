"""``python -m relevancy_tracer_testing.model_host``: the product's model host
(:func:`relevancy_tracer.models.host.main`, same arguments) that also serves the scripted models
of :data:`relevancy_tracer_testing.SCRIPTED_HOST_MODELS`. Clients start it in place of
``relevancy_tracer.models.host`` once :func:`relevancy_tracer_testing.use_scripted_host_models`
ran in their process."""

from __future__ import annotations

import sys
from typing import Optional


def main(argv: Optional[list[str]] = None) -> int:
    """Register the scripted models, then run the model host in the foreground."""
    from relevancy_tracer.models import host

    from . import use_scripted_host_models

    use_scripted_host_models()
    return host.main(argv)


if __name__ == "__main__":
    sys.exit(main())
