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

// BufferedEvents is the number of cache events waiting for TakeEvents.
func (c *Connector) BufferedEvents() int { return len(c.sched.events) }
