"""The async shell around the core: one tick (observe -> plan -> act), the loop, the lock, HTTP and wiring."""
