"""ACL graph capture and replay. Not wired up yet: the platform runs eager
(CompilationMode.NONE, CUDAGraphMode.NONE) and reports no static graph support."""
