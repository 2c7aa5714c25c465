"""The eager path: one aten op at a time through the pipeline (backend kernel → decomposition →
CPU fallback → clear error), with the schema facts, number checks, ``out=`` rules and prepared
calls it needs, and the ops the runtime implements itself (core ops, attention, RNN cells,
autocast)."""
