package consumer

import "time"

// SetNATSRedelivery shortens the JetStream redelivery bounds, for the
// tests of those bounds: the first delay, the longest, and the deliveries
// after which an out-of-order cancel is terminated.
func (c *Consumer) SetNATSRedelivery(delay, longest time.Duration, outOfOrder uint64) {
	c.natsRetry, c.natsRetryMax, c.natsOutOfOrder = delay, longest, outOfOrder
}
