package offload

// CorruptCPUTier changes every float in the CPU tier, so every later load fails its checksum:
// the fault-injection seam for the load-error path.
func (c *Connector) CorruptCPUTier() {
	w := c.worker
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.buf {
		w.buf[i]++
	}
}
