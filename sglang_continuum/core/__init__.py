"""Engine-agnostic Continuum policy: program registry, TTL models, pin table, priority.

Nothing here imports SGLang or torch, so it runs in unit tests in milliseconds and can drive an
emulator or another engine.
"""
