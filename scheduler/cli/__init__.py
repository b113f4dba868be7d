"""The ``scheduler`` command: ``main`` defines the core commands and imports the groups
(``admin``, ``ops``, ``recurring``, ``console``), which register themselves; ``common``
holds the error contract and the helpers they share."""
