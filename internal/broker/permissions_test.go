package broker_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/brokertest"
)

// natsServerBinary is the nats-server the project's machines install.
const natsServerBinary = "/usr/sbin/nats-server"

// relayPermissions are the least a relay's NATS user needs, as
// docs/brokers.md states them: publish to its destinations' subjects, to
// the JetStream API subjects of a duplicate ack's check (the stream's info,
// and its message by sequence, directly or through the API), and receive
// the acks on its inbox.
const relayPermissions = `{
	publish: {allow: ["orders.>", "$JS.API.STREAM.INFO.*", "$JS.API.STREAM.MSG.GET.*", "$JS.API.DIRECT.GET.*"]}
	subscribe: {allow: ["_INBOX.>"]}
}`

// natsServer starts a nats-server of the test's own, with JetStream in a
// temporary directory and one account holding an admin user and a relay
// user with permissions; it stops when the test ends. It returns the
// server's URL without a user.
func natsServer(t *testing.T, permissions string) string {
	t.Helper()
	if _, err := os.Stat(natsServerBinary); err != nil {
		t.Skipf("no %s: %v", natsServerBinary, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	dir := t.TempDir()
	conf := fmt.Sprintf(`listen: "127.0.0.1:%d"
jetstream {store_dir: %q}
accounts {
	ORDERS {
		jetstream: enabled
		users: [
			{user: admin, password: admin}
			{user: relay, password: relay, permissions: %s}
		]
	}
}
`, port, filepath.Join(dir, "jetstream"), permissions)
	confFile := filepath.Join(dir, "nats.conf")
	require.NoError(t, os.WriteFile(confFile, []byte(conf), 0o600))
	cmd := exec.Command(natsServerBinary, "-c", confFile)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("nats-server's log:\n%s", log.String())
		}
	})
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	require.Eventually(t, func() bool {
		nc, err := nats.Connect(url, nats.UserInfo("admin", "admin"))
		if err != nil {
			return false
		}
		nc.Close()
		return true
	}, 10*time.Second, 20*time.Millisecond, "the nats-server answers")
	return url
}

// The relay publishes to JetStream, duplicate acks included, as a user
// holding only the permissions docs/brokers.md lists: a duplicate ack's
// check reads the stream through the JetStream API, and a relay user that
// may only publish turned every duplicate ack (the lost-ack retry that
// deduplication exists for) into a failure.
func TestNATSRelayNeedsOnlyTheDocumentedPermissions(t *testing.T) {
	t.Parallel()
	url := natsServer(t, relayPermissions)
	nc, err := nats.Connect(url, nats.UserInfo("admin", "admin"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	for _, direct := range []bool{false, true} {
		name := fmt.Sprintf("ORDERS_%t", direct)
		prefix := fmt.Sprintf("orders.%t", direct)
		_, err := brokertest.CreateStream(ctxT(t), js, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"},
			AllowDirect: direct, Duplicates: time.Minute})
		require.NoError(t, err)
	}
	tr := broker.NewNATS(strings.Replace(url, "nats://", "nats://relay:relay@", 1), source)
	t.Cleanup(tr.Close)

	for _, direct := range []bool{false, true} {
		prefix := fmt.Sprintf("orders.%t", direct)
		d := delivery(t, "nats:"+prefix+".billing", "o-1")
		require.True(t, tr.Deliver(ctxT(t), d).Acked, "direct get %t: a first publish", direct)
		res := tr.Deliver(ctxT(t), d)
		require.NoError(t, res.Err, "direct get %t: a duplicate ack's check may read the stream", direct)
		require.True(t, res.Acked, "direct get %t: the republished event is acked as the duplicate it is", direct)
		audit := delivery(t, "nats:"+prefix+".audit", "o-1")
		audit.EventID = d.EventID
		res = tr.Deliver(ctxT(t), audit)
		require.ErrorContains(t, res.Err, "one stream captures two destinations",
			"direct get %t: the check still tells another subject's copy", direct)
	}
}

// A relay user denied the JetStream API gets a failure that says which
// permission its duplicate-ack check lacks, at once, not a publish that
// waits out its deadline; so does one denied a destination's subject.
func TestNATSRelayWithoutTheAPIPermissionsSaysSo(t *testing.T) {
	t.Parallel()
	url := natsServer(t, `{publish: {allow: ["orders.>"]}, subscribe: {allow: ["_INBOX.>"]}}`)
	nc, err := nats.Connect(url, nats.UserInfo("admin", "admin"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = brokertest.CreateStream(ctxT(t), js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: time.Minute})
	require.NoError(t, err)
	tr := broker.NewNATS(strings.Replace(url, "nats://", "nats://relay:relay@", 1), source)
	t.Cleanup(tr.Close)

	d := delivery(t, "nats:orders.billing", "o-1")
	require.True(t, tr.Deliver(ctxT(t), d).Acked, "publishing needs no API permission")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	res := tr.Deliver(ctx, d)
	require.False(t, res.Acked)
	require.ErrorContains(t, res.Err, "$JS.API.STREAM.INFO.ORDERS", "the error names the permission the check lacks")
	require.Less(t, time.Since(start), 2*time.Second, "the denial is reported at once, not at the deadline")

	start = time.Now()
	res = tr.Deliver(ctx, delivery(t, "nats:billing.events", "o-1"))
	require.ErrorContains(t, res.Err, `Publish to "billing.events"`, "the error names the subject denied")
	require.False(t, res.MessageFault, "a subject the relay may not publish to is the destination's trouble")
	require.Less(t, time.Since(start), 2*time.Second, "the denial is reported at once, not at the deadline")
}

// The Kafka relay produces as a user holding only the ACLs docs/brokers.md
// lists (WRITE on its topics), and a topic it holds none for is refused
// as TOPIC_AUTHORIZATION_FAILED, the destination's trouble.
func TestKafkaRelayNeedsOnlyTheDocumentedACLs(t *testing.T) {
	t.Parallel()
	const method = "SCRAM-SHA-512"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "billing"), kfake.EnableSASL(),
		kfake.EnableACLs(), kfake.Superuser(method, "admin", "admin"),
		kfake.User(method, "relay", "relay", kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "orders",
			Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationWrite, Allow: true}))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	tr, err := broker.NewKafka(broker.Config{KafkaBrokers: c.ListenAddrs(), KafkaUser: "relay", KafkaPassword: "relay"}, source)
	require.NoError(t, err)
	t.Cleanup(tr.Close)

	res := tr.Deliver(ctxT(t), delivery(t, "kafka:orders", "o-1"))
	require.NoError(t, res.Err, "WRITE on the topic is all an idempotent produce needs")
	require.True(t, res.Acked)
	res = tr.Deliver(ctxT(t), delivery(t, "kafka:billing", "o-1"))
	require.ErrorContains(t, res.Err, "TOPIC_AUTHORIZATION_FAILED")
	require.False(t, res.MessageFault, "a topic the relay may not write is the destination's trouble")
}
