package bus

import "sync"

// outBuffer is how many events a subscription's Events channel holds before they queue.
const outBuffer = 64

// eventQueue sits between whoever produces a subscription's events (a publisher, a Redis
// reader) and the subscriber's Events channel. It queues without bound, so the producer never
// blocks on a slow subscriber and nothing is dropped: a subscriber has to keep up, it does not
// lose commands silently. An event goes straight into the channel when nothing is queued
// ahead of it (the usual case: one goroutine hand-off less); otherwise the forwarding
// goroutine delivers the queue in order.
type eventQueue struct {
	out  chan Event
	wake chan struct{}
	done chan struct{}
	exit chan struct{} // closed when forward has returned

	mu      sync.Mutex
	queue   []Event
	pending int  // events queued or held by forward, not yet in out
	stopped bool // set before done closes, so put never sends on a closed out
	once    sync.Once
}

func newEventQueue() *eventQueue {
	q := &eventQueue{out: make(chan Event, outBuffer), wake: make(chan struct{}, 1), done: make(chan struct{}), exit: make(chan struct{})}
	go q.forward()
	return q
}

// put delivers ev after every event put before it; it never blocks. After stop it is
// discarded, since nobody reads any more.
func (q *eventQueue) put(ev Event) {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		return
	}
	if q.pending == 0 {
		select {
		case q.out <- ev:
			q.mu.Unlock()
			return
		default:
		}
	}
	q.queue = append(q.queue, ev)
	q.pending++
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *eventQueue) forward() {
	defer close(q.exit)
	defer close(q.out)
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.mu.Unlock()
			select {
			case <-q.wake:
				continue
			case <-q.done:
				return
			}
		}
		ev := q.queue[0]
		q.queue[0] = Event{} // let the payload be collected once delivered
		q.queue = q.queue[1:]
		q.mu.Unlock()
		select {
		case q.out <- ev:
		case <-q.done:
			return
		}
		q.mu.Lock()
		q.pending--
		q.mu.Unlock()
	}
}

// stop ends forwarding (undelivered events are discarded) and closes out; it returns once the
// forwarding goroutine has exited, so a closed subscription leaves nothing running.
func (q *eventQueue) stop() {
	q.once.Do(func() {
		q.mu.Lock()
		q.stopped = true
		q.mu.Unlock()
		close(q.done)
	})
	<-q.exit
}
