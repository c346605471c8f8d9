package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// NATS publishes to JetStream subjects. Each message carries Nats-Msg-Id =
// the event id, so the stream drops a second publish of the event within
// its duplicate window (2 minutes unless the stream says otherwise), and
// the publish waits for the stream's ack: an event is delivered once it is
// stored.
type NATS struct {
	url, source string
	// schemas are the dataschema of each event type (Config.DataSchemas).
	schemas map[string]string

	mu     sync.Mutex
	nc     *nats.Conn
	js     jetstream.JetStream
	closed bool
	failed failedDial
	// dialing is closed when the dial in progress ends; nil when none is.
	dialing chan struct{}
	// denials ends the requests a permission violation refused.
	denials denials
}

// NewNATS returns a transport to the NATS servers at url. It connects at
// the first publish.
func NewNATS(url, source string) *NATS { return &NATS{url: url, source: source} }

// natsPingInterval is how often an idle connection is checked: two pings
// without an answer and it is dropped and dialed anew. nats.go's default
// (2 minutes) left a connection a dropped network had silently cut for 4
// to 6 minutes, every publish on it timing out and opening circuits.
const natsPingInterval = 10 * time.Second

// errNATSClosed is a publish after Close.
var errNATSClosed = errors.New("the NATS transport is closed")

// conn returns the JetStream context, connecting if there is none. A
// connection reconnects by itself once made; a closed one is replaced. The
// dial runs in the background and the publishes that need it share it,
// each waiting no longer than its own deadline: nats.go tries every seed
// address in turn, a timeout apiece against servers that accept and never
// answer, past any delivery's deadline.
func (t *NATS) conn(ctx context.Context) (jetstream.JetStream, error) {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, errNATSClosed
		}
		if t.nc != nil && !t.nc.IsClosed() {
			js := t.js
			t.mu.Unlock()
			return js, nil
		}
		if err := t.failed.recent(); err != nil {
			t.mu.Unlock()
			return nil, err
		}
		if t.dialing == nil {
			t.dialing = make(chan struct{})
			go t.dial(t.dialing)
		}
		dialing := t.dialing
		t.mu.Unlock()
		if err := awaitDial(ctx, dialing, "NATS"); err != nil {
			return nil, err
		}
	}
}

// dial connects and keeps the connection, or the failure, then closes
// done. The connection's options outlive the dial (its reconnects use
// them), so its timeout is a fixed one, not a publish's.
func (t *NATS) dial(done chan struct{}) {
	nc, err := nats.Connect(t.url, nats.Name("outbox-relay"), nats.Timeout(dialTimeout), nats.MaxReconnects(-1),
		nats.PingInterval(natsPingInterval), nats.MaxPingsOutstanding(2),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { t.denials.report(err) }))
	var js jetstream.JetStream
	if err != nil {
		err = fmt.Errorf("connecting to NATS: %w", hideURL(err))
	} else if js, err = jetstream.New(nc); err != nil {
		nc.Close()
		err = fmt.Errorf("opening JetStream: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	defer close(done)
	t.dialing = nil
	switch {
	case err != nil:
		t.failed.set(err)
	case t.closed:
		nc.Close()
	default:
		t.nc, t.js = nc, js
	}
}

// Deliver implements relay.Transport.
func (t *NATS) Deliver(ctx context.Context, d relay.Delivery) relay.Result {
	dest := d.Target()
	js, err := t.conn(ctx)
	if err != nil {
		return relay.Result{Err: err}
	}
	msg := nats.NewMsg(dest.Name)
	msg.Data = d.Data
	ce, trace := attributes(d, t.source, t.schemas)
	// The NATS binding's binary mode: attributes as ce- headers,
	// percent-encoded beyond printable ASCII.
	for _, a := range ce {
		msg.Header.Set("ce-"+a.name, percentEncode(a.value))
	}
	for _, a := range trace {
		msg.Header.Set(a.name, a.value)
	}
	// The NATS binding names the data's media type ce-datacontenttype;
	// content-type is kept for consumers that read that.
	msg.Header.Set("ce-datacontenttype", contentType)
	msg.Header.Set("content-type", contentType)
	pctx, done := t.denials.watch(ctx, dest.Name)
	ack, err := js.PublishMsg(pctx, msg, jetstream.WithMsgID(d.EventID.String()))
	done()
	if err != nil {
		err = t.denials.cause(pctx, err)
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			err = fmt.Errorf("no JetStream stream captures subject %q: %w", dest.Name, err)
		}
		// Too large for the server or the stream: this message's fault.
		tooLarge := errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum)
		return relay.Result{Err: fmt.Errorf("publishing to JetStream: %w", err), MessageFault: tooLarge}
	}
	if ack.Duplicate {
		// The check reads the stream through the JetStream API, which the
		// relay's user may be denied (docs/brokers.md lists what it needs).
		cctx, done := t.denials.watch(ctx, "$JS.API.STREAM.INFO."+ack.Stream, "$JS.API.STREAM.MSG.GET."+ack.Stream,
			"$JS.API.DIRECT.GET."+ack.Stream)
		err := sameSubject(cctx, js, ack, dest.Name)
		done()
		if cause := t.denials.cause(cctx, err); cause != err {
			return relay.Result{Err: fmt.Errorf("checking a duplicate publish: %w", cause)}
		}
		if err != nil {
			return relay.Result{Err: err}
		}
	}
	return relay.Result{Acked: true}
}

// sameSubject checks that the message a duplicate ack points at was
// published to subject. JetStream deduplicates on Nats-Msg-Id per stream,
// whatever the subject: when one stream captures the subjects of two
// destinations of an event, the second publish is dropped as a duplicate
// of the first and would be recorded as delivered though it never reached
// its subject. That is a failed attempt with the reason, not a silent loss.
func sameSubject(ctx context.Context, js jetstream.JetStream, ack *jetstream.PubAck, subject string) error {
	s, err := js.Stream(ctx, ack.Stream)
	if err != nil {
		return fmt.Errorf("checking a duplicate publish: %w", err)
	}
	stored, err := s.GetMsg(ctx, ack.Sequence)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// Gone since (a work-queue stream deletes what its consumer
		// acked; limits age messages out). Only a stream that captures
		// this one subject alone must have held it on this subject; in
		// any other, it may have been another destination's copy, and
		// the publish is tried again until the duplicate window is over.
		if subjects := s.CachedInfo().Config.Subjects; len(subjects) == 1 && subjects[0] == subject {
			return nil
		}
		return fmt.Errorf("stream %q dropped the event as a duplicate of a message it no longer holds, which may have been "+
			"on another of its subjects; JetStream deduplicates on the event id per stream: give each destination a stream "+
			"of its own (this publish is stored once the stream's duplicate window is over)", ack.Stream)
	}
	if err != nil {
		return fmt.Errorf("checking a duplicate publish: %w", err)
	}
	if stored.Subject != subject {
		return fmt.Errorf("stream %q dropped the event as a duplicate of the one it holds on subject %q: "+
			"one stream captures two destinations of the event, and JetStream deduplicates on the event id per stream; "+
			"give each destination a stream of its own", ack.Stream, stored.Subject)
	}
	return nil
}

// Close closes the connection, if any, and makes every later publish fail.
func (t *NATS) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.nc != nil {
		t.nc.Close()
	}
}

// denials ends at once the requests whose subject the server refused to
// take from the relay's user. nats.go reports a permission violation only
// to the connection's error handler, and the request it refused waits
// for a reply that never comes until its deadline: every duplicate ack
// of a relay user that may not read the stream took the whole delivery
// timeout, and failed as a timeout that named no cause.
type denials struct {
	mu      sync.Mutex
	waiting map[*denialWatch]struct{}
}

// denialWatch is one request waiting on subjects.
type denialWatch struct {
	subjects []string
	cancel   context.CancelCauseFunc
}

// errDenied wraps a permission violation that ended a request.
var errDenied = errors.New("the relay's NATS user is not allowed to publish to a subject it needs (see docs/brokers.md, Least privileges)")

// watch returns ctx, ended with the violation if the server refuses one of
// subjects meanwhile, and the function that stops watching.
func (d *denials) watch(ctx context.Context, subjects ...string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &denialWatch{subjects: subjects, cancel: cancel}
	d.mu.Lock()
	if d.waiting == nil {
		d.waiting = map[*denialWatch]struct{}{}
	}
	d.waiting[w] = struct{}{}
	d.mu.Unlock()
	return ctx, func() {
		d.mu.Lock()
		delete(d.waiting, w)
		d.mu.Unlock()
		cancel(nil)
	}
}

// report ends the requests on the subject err, a permission violation,
// names: the server's -ERR 'Permissions Violation for Publish to "…"'.
func (d *denials) report(err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	_, subject, ok := strings.Cut(err.Error(), `Publish to "`)
	if !ok {
		return
	}
	subject, _, _ = strings.Cut(subject, `"`)
	d.mu.Lock()
	defer d.mu.Unlock()
	for w := range d.waiting {
		if slices.Contains(w.subjects, subject) {
			w.cancel(fmt.Errorf("%w: %w", errDenied, err))
		}
	}
}

// cause is err, or the permission violation that ended ctx in its stead.
func (d *denials) cause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, errDenied) {
		return cause
	}
	return err
}
