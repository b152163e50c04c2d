"""Code generation: shared-memory layout and the PTX emitter."""
