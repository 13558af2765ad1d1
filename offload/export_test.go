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

// CorruptCPUFloat changes float i of the CPU tier (slot i / chunk floats).
func (c *Connector) CorruptCPUFloat(i int) {
	w := c.worker
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf[i] = -w.buf[i] - 1
}

// SharedCopies is the number of transfer batches whose copy was offered to the copy helpers.
func (c *Connector) SharedCopies() int64 { return c.worker.copies.shared.Load() }
