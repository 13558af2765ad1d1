package bus

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// watchFailovers follows the sentinels' +switch-master announcements for the bus's master
// and moves every subscription to the new primary when one comes. go-redis's failover client
// sends commands to the new primary by itself, but a subscription's connection stays on the
// old one, which now is a replica: it still hears what is published there through
// replication, yet PUBLISH on the new primary counts no subscriber, so a command would find
// "nobody subscribed". It runs until the bus closes; watchDone is closed when it exits.
func (r *Redis) watchFailovers(o *redis.UniversalOptions) {
	defer close(r.watchDone)
	fails := 0
	for i := 0; ; i++ {
		addr := o.Addrs[i%len(o.Addrs)]
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr, Username: o.SentinelUsername, Password: o.SentinelPassword,
			TLSConfig: o.TLSConfig, DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			DisableIdentity: true, MaxRetries: -1})
		ps := sc.Subscribe(context.Background())
		r.mu.Lock()
		r.watchPS = ps
		stopped := r.closed.Load()
		r.mu.Unlock()
		if stopped {
			_ = ps.Close()
			_ = sc.Close()
			return
		}
		err := ps.Subscribe(context.Background(), "+switch-master")
		if err == nil {
			err = r.followSwitches(ps, o.MasterName, fails > 0)
		}
		_ = ps.Close()
		_ = sc.Close()
		if r.closed.Load() {
			return
		}
		fails++
		r.log.Debug("bus: sentinel watch lost, trying the next sentinel", "sentinel", addr, "err", err)
		if !r.sleep(backoff(fails, r.backoff)) {
			return
		}
	}
}

// followSwitches reads one sentinel's announcements until its connection fails. again says
// the watch was lost before: a switch may have gone unheard meanwhile, so every
// subscription moves once the watch is back.
func (r *Redis) followSwitches(ps *redis.PubSub, master string, again bool) error {
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(context.Background(), r.health)
		if r.closed.Load() {
			return nil
		}
		if err != nil {
			var nerr net.Error
			if errors.As(err, &nerr) && nerr.Timeout() && !pinged {
				pinged = true
				if ps.Ping(context.Background()) == nil {
					continue
				}
			}
			return err
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if again {
				r.moveSubscriptions("sentinel watch re-established")
			}
		case *redis.Message:
			// "<master> <old-ip> <old-port> <new-ip> <new-port>"
			if f := strings.Fields(m.Payload); len(f) == 5 && f[0] == master {
				r.log.Info("bus: redis primary switched, moving subscriptions", "master", master,
					"from", net.JoinHostPort(f[1], f[2]), "to", net.JoinHostPort(f[3], f[4]))
				r.moveSubscriptions("primary switched")
			}
		}
	}
}

// moveSubscriptions gives every subscription a new connection (to the current primary); each
// reports EventSubscribed once it is confirmed, so its reader resyncs.
func (r *Redis) moveSubscriptions(why string) {
	r.mu.Lock()
	subs := make([]*redisSub, 0, len(r.subs))
	for s := range r.subs {
		subs = append(subs, s)
	}
	r.mu.Unlock()
	for _, s := range subs {
		r.log.Debug("bus: resubscribing", "channel", s.channel, "why", why)
		s.reconnect()
	}
}

// sleep waits d or until the bus closes; it reports whether to go on.
func (r *Redis) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.stop:
		return false
	}
}
