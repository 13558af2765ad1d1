package bus

import "sync"

// eventQueue sits between whoever produces a subscription's events (a publisher, a Redis
// reader) and the subscriber's Events channel. It queues without bound and forwards on its own
// goroutine, so the producer never blocks on a slow subscriber and nothing is dropped: a
// subscriber that needs back-pressure has to read faster, not lose commands silently.
type eventQueue struct {
	out  chan Event
	wake chan struct{}
	done chan struct{}
	exit chan struct{} // closed when forward has returned

	mu    sync.Mutex
	queue []Event
	once  sync.Once
}

func newEventQueue() *eventQueue {
	q := &eventQueue{out: make(chan Event), wake: make(chan struct{}, 1), done: make(chan struct{}), exit: make(chan struct{})}
	go q.forward()
	return q
}

// put queues ev; after stop it is discarded, since nobody reads any more.
func (q *eventQueue) put(ev Event) {
	q.mu.Lock()
	q.queue = append(q.queue, ev)
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
		var ev Event
		have := len(q.queue) > 0
		if have {
			ev = q.queue[0]
			q.queue[0] = Event{} // let the payload be collected once delivered
			q.queue = q.queue[1:]
		}
		q.mu.Unlock()
		if !have {
			select {
			case <-q.wake:
				continue
			case <-q.done:
				return
			}
		}
		select {
		case q.out <- ev:
		case <-q.done:
			return
		}
	}
}

// stop ends forwarding (undelivered events are discarded) and closes out; it returns once the
// forwarding goroutine has exited, so a closed subscription leaves nothing running.
func (q *eventQueue) stop() {
	q.once.Do(func() { close(q.done) })
	<-q.exit
}
