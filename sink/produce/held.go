package produce

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Held reports whether err is a broker's answer that a healthy cluster gives
// for a while: a code Kafka calls retriable (a leader or coordinator that
// moves or loads, a timeout, throttling, too few replicas in sync), or one
// that Kafka does not, but that a broker answers with while it recovers:
// UNKNOWN_SERVER_ERROR (an exception inside the broker, as when a log is
// being loaded or a replica fetcher restarts), CONCURRENT_TRANSACTIONS and
// TRANSACTION_ABORTABLE (the coordinator still ends an earlier
// transaction). The relay holds the events refused so, and retries for as
// long as it lasts: it never stops on them.
func Held(err error) bool {
	var ke *kerr.Error
	if !errors.As(err, &ke) {
		return false
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
		// Retriable to Kafka, and answered for a while by a broker whose
		// metadata lags; but also for good for a topic that does not
		// exist: not held for ever (sink.Persistent).
		return false
	}
	return ke.Retriable || errors.Is(err, kerr.UnknownServerError) || errors.Is(err, kerr.ConcurrentTransactions) || errors.Is(err, kerr.TransactionAbortable)
}
