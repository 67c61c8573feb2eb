"""ACL graph capture and replay: the graph backend (device or simulated), the static graph
wrapper vLLM uses for FULL and PIECEWISE graphs, and the attention parameter-update
protocol that keeps replayed attention tasks current."""
