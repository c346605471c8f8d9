package relay

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// notifyChannel is the channel Enqueue notifies on (NotifyRelays) and
// relays listen on (Config.Listen). A notification's payload names the
// destinations the transaction wrote messages for, comma-separated, or is
// empty for "any".
const notifyChannel = "outbox"

// The wake-up at commit, opt-in. A relay with Listen holds a connection of
// its own LISTENing on notifyChannel. A notification wakes the deliver job
// of this relay serving a destination it names, at once instead of at its
// next poll; a destination no job of this relay serves wakes the dispatch
// loop, at most once per wakeSpacing. Wake-ups coalesce: a burst of commits
// makes one claim per job and one dispatch, not one per commit. The poll
// goes on beside it and is what makes delivery correct: a notification lost
// with a dropped connection, or sent while the listener reconnects, delays a
// message by one poll interval at most.

// wakeSpacing bounds how often notifications make a relay dispatch: every
// relay hears every notification, and the ones not serving its destinations
// would otherwise look for due work at every commit.
const wakeSpacing = 10 * time.Millisecond

// wakeDispatch wakes the dispatch loop.
func (r *Relay) wakeDispatch() {
	select {
	case r.dispatchNow <- struct{}{}:
	default: // a wake-up is already waiting: this one joins it
	}
}

// serving registers a deliver job's wake-up channel for its destination
// until the returned function is called.
func (r *Relay) serving(dest uuid.UUID, wake chan struct{}) (done func()) {
	r.wakeMu.Lock()
	r.sessions[dest] = wake
	r.wakeMu.Unlock()
	return func() {
		r.wakeMu.Lock()
		// Only its own: a job of this relay that took the destination over
		// (after this relay was declared dead and came back) has its own.
		if r.sessions[dest] == wake {
			delete(r.sessions, dest)
		}
		r.wakeMu.Unlock()
	}
}

// wake wakes the jobs serving the destinations a notification names (all
// of them for an empty payload), and the dispatch loop for destinations no
// job of this relay serves.
func (r *Relay) wake(payload string) {
	r.wakeMu.Lock()
	defer r.wakeMu.Unlock()
	dispatch := payload == ""
	signal := func(c chan struct{}) {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	if payload == "" {
		for _, c := range r.sessions {
			signal(c)
		}
	}
	for s := range strings.SplitSeq(payload, ",") {
		if s == "" {
			continue
		}
		dest, err := uuid.Parse(s)
		if err != nil {
			dispatch = true
			continue
		}
		if c, ok := r.sessions[dest]; ok {
			signal(c)
		} else {
			dispatch = true
		}
	}
	if dispatch {
		r.wakeDispatch()
	}
}

// listen LISTENs for commits until ctx is done, reconnecting as needed.
func (r *Relay) listen(ctx context.Context) {
	var warned time.Time
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(warned) > 30*time.Second {
			warned = time.Now()
			r.logger.WarnContext(ctx, "relay listener: reconnecting; the poll delivers meanwhile", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	// Commits made while no one listened notified nobody.
	r.wake("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		r.metrics.wakeups.Inc()
		r.wake(n.Payload)
	}
}
