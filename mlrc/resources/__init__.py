"""Files mlrc ships as package data, found with ``importlib.resources.files("mlrc.resources")``.

- ``presets/``: the protocol presets (``cpu``, ``reference``) a study names with ``preset:``;
- ``dashboard/``: the dashboard's HTML/CSS/JS templates.

``studies/presets`` in a checkout is a link to the folder here. The built-in search spaces live
beside their kind (``mlrc/methods/<kind>/spaces/<name>.yaml``, see :mod:`mlrc.registry`).
"""
