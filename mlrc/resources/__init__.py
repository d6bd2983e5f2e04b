"""Files mlrc ships as package data, found with ``importlib.resources.files("mlrc.resources")``.

- ``presets/``: the protocol presets (``cpu``, ``reference``) a study names with ``preset:``;
- ``spaces/``: each loss's default search space (``<loss>.yaml``), with ``miners/`` and
  ``strategies/`` beside them;
- ``dashboard/``: the dashboard's HTML/CSS/JS templates.

``studies/presets`` and ``studies/spaces`` in a checkout are links to the folders here.
"""
