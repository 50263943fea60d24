"""Test-session settings: under CI (``CI`` set, as ``.ci/run`` is run), hypothesis draws a
fixed set of examples (``derandomize``), so a CI verdict does not depend on the luck of the
draw; local runs keep exploring new examples each time."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
