package outbox

// ParseDestination lets the external tests check that what URLOf writes,
// the relay reads back as the same kind; the product has no caller outside
// this package.
var ParseDestination = parseDestination
