"""The contract of every layer: what crosses a Temporal boundary, and every name Temporal
matches on, one module per boundary (`contract.remediation`, `contract.kube`,
`contract.names`, ...). Callers import from the boundary module; this package re-exports
nothing.

Everything that crosses a Temporal boundary is one of these pydantic models and travels
through the SDK's pydantic data converter (`worker.converter.DATA_CONVERTER`: the runbook set,
frozen, converted once per distinct set). Rules:
- one `XxxInput` / `XxxResult` per boundary; new fields are always defaulted so recorded
  histories keep replaying;
- no secrets: credentials are read by activities from env or files, never carried here;
- these modules import only the stdlib, pydantic and each other (base, names and errors at
  the bottom; no cycles), so workflows can import them inside the sandbox.
"""
