"""The contract of every layer: what crosses a Temporal boundary, and every name Temporal
matches on. Import from the boundary module (`contract.kube`, `contract.names`, ...); this
package re-exports nothing. Modules here import only the stdlib, pydantic and each other, so
workflows can import them inside the sandbox."""
