"""The manager API: ``KVCacheManager`` (what a scheduler calls), the ``KVCacheBlocks`` it
returns, the admission bound and the manager-wide integrity checks. Sits on the
coordinators; the engine, the simulator and the server sit on it."""
