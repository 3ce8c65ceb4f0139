"""The served default artifacts, shipped with the package.

This folder is the repository's artifact store (``compiled/<program>/<lang or task>/<metric>/vNNNN/``). The wheel
carries, as package data of ``halluscope.compiled``, only the version each program/language-or-task/metric serves
by default (never a retired or outranked one): the list is in pyproject.toml, written by
``python scripts/bundle_artifacts.py`` and checked by ``tests/test_bundled_artifacts.py``.
:func:`halluscope.artifacts.store.store_roots` reads them beside the user's ``<home>/compiled``.
"""
