"""The compiled path: ``torch.compile(backend=<name>)`` — Dynamo glue, the graph compiler every
backend's lowering plugs into, FlexAttention inlining and the compile statistics."""
