"""The TTL models' names and nothing else, so that the settings can check ``ttl_model`` without
importing the models (which read the settings: ``ttl_registry.py`` maps each name to its model
and checks at import that it covers exactly these)."""

TTL_MODEL_NAMES = frozenset({"cost", "fixed", "reference", "bernstein"})
