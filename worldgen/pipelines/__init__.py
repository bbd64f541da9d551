"""The two pipelines (base and Fast), their scheduler, camera conditioning, caches and the loader that picks one."""
