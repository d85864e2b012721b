package txn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/failure"
)

// offsetsSegmentBytes is the segment size of an offsets topic walrelay
// creates: compaction cleans only closed segments, and at Kafka's default
// (1 GiB) the open one would hold millions of positions; at 16 MiB it
// holds tens of thousands (a position record with its transaction's
// commit marker takes a few hundred bytes).
const offsetsSegmentBytes = "16777216"

// offsetsTopicConfigs are the configs of an offsets topic walrelay creates.
var offsetsTopicConfigs = map[string]string{"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.bytes": offsetsSegmentBytes}

// EnsureOffsetsTopic creates the offsets topic if it is missing, with one
// compacted partition, and refuses one of another shape. Package sink's
// Ping calls it.
func (p *Producer) EnsureOffsetsTopic(ctx context.Context) error {
	return p.ensureOffsetsTopic(ctx, offsetsTopicConfigs)
}

// ensureOffsetsTopic creates the offsets topic if it is missing, with one
// partition and configs (offsetsTopicConfigs), and refuses one of another
// shape.
func (p *Producer) ensureOffsetsTopic(ctx context.Context, configs map[string]string) error {
	topic := p.cfg.OffsetsTopic
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 1, -1
	for k, v := range configs {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = k, kmsg.StringPtr(v)
		rt.Configs = append(rt.Configs, c)
	}
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	resp, err := req.RequestWith(ctx, p.Client())
	if err != nil {
		return fmt.Errorf("create the offsets topic %s: %w", topic, err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); errors.Is(err, kerr.InvalidReplicationFactor) {
		// The cluster counts fewer brokers than its default replication
		// factor: one restarting, or a cluster too small for it.
		return fmt.Errorf("create the offsets topic %s: %w (%w: fewer brokers than default.replication.factor answer: one restarting, or set the broker's default.replication.factor, or create the topic)", topic, err, ErrOffsetsTopicNotReady)
	} else if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create the offsets topic %s: %w", topic, err)
	}
	// A topic just created may show no partitions for a moment.
	for try := 0; ; try++ {
		exists, err := offsetsTopicShape(ctx, p.Client(), p.log, topic)
		if err != nil || exists || try == 50 {
			if err == nil && !exists {
				err = fmt.Errorf("the offsets topic %s does not show in the metadata after its creation: %w", topic, ErrOffsetsTopicNotReady)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the offsets topic %s: %w", topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// offsetsTopicShape reports whether the offsets topic exists, asking with
// cl, and refuses (fatal) one of another shape than one compacted
// partition. It changes nothing.
func offsetsTopicShape(ctx context.Context, cl *kgo.Client, log *slog.Logger, topic string) (exists bool, err error) {
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil {
		return false, fmt.Errorf("read the offsets topic's metadata: %w", err)
	}
	n := len(mresp.Topics[0].Partitions)
	if n == 0 {
		return false, nil
	}
	if n != 1 {
		return true, failure.Mark(failure.Fatal, fmt.Errorf("the offsets topic %s has %d partitions: it must have one (kafka.offsets_topic names another, or delete it when no relay uses it)", topic, n))
	}
	dreq := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	res.ConfigNames = []string{"cleanup.policy"}
	dreq.Resources = append(dreq.Resources, res)
	dresp, err := dreq.RequestWith(ctx, cl)
	if err != nil || len(dresp.Resources) == 0 || dresp.Resources[0].ErrorCode != 0 {
		log.Warn("cannot read the offsets topic's cleanup.policy", "topic", topic, "err", err)
		return true, nil
	}
	for _, c := range dresp.Resources[0].Configs {
		if c.Name == "cleanup.policy" && c.Value != nil && !strings.Contains(*c.Value, "compact") {
			return true, failure.Mark(failure.Fatal, fmt.Errorf("the offsets topic %s has cleanup.policy=%s: it must be compact (a deleted position would resend everything after it)", topic, *c.Value))
		}
	}
	return true, nil
}

// Check reports whether the brokers, asked with cl, give what exactly-once
// mode needs: transactions (the InitProducerId and EndTxn requests), the
// right to use transactionalID where the brokers can tell (DescribeTransactions,
// Kafka 3.0+: an ACL that grants WRITE on the transactional id implies
// DESCRIBE), and an offsets topic of the right shape if it exists (Resume
// creates a missing one). It changes nothing: it fences nobody. Package
// sink's CheckTransactions calls it, in either mode.
func Check(ctx context.Context, cl *kgo.Client, log *slog.Logger, offsetsTopic, transactionalID string) (string, error) {
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		return "", fmt.Errorf("ask the brokers' API versions: %w", err)
	}
	has := map[int16]bool{}
	for _, k := range resp.ApiKeys {
		has[k.ApiKey] = true
	}
	if !has[int16(kmsg.InitProducerID)] || !has[int16(kmsg.EndTxn)] || !has[int16(kmsg.AddPartitionsToTxn)] {
		return "", errors.New("the brokers do not support transactions (InitProducerId, AddPartitionsToTxn, EndTxn)")
	}
	var parts []string
	switch {
	case transactionalID == "":
		parts = append(parts, "transactional id not known (the database did not answer)")
	case has[int16(kmsg.DescribeTransactions)]:
		ok, err := mayUseTransactionalID(ctx, cl, transactionalID)
		if err != nil {
			return "", err
		}
		if !ok {
			return "", fmt.Errorf("the brokers refuse transactional id %s to this principal (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): grant WRITE on TransactionalId %s, or set kafka.transactional_id to one it may use", transactionalID, transactionalID)
		}
		parts = append(parts, "transactional id "+transactionalID+" allowed")
	default:
		parts = append(parts, "transactional id "+transactionalID+" (the brokers cannot tell whether it is allowed)")
	}
	exists, err := offsetsTopicShape(ctx, cl, log, offsetsTopic)
	if err != nil {
		return "", err
	}
	if !exists {
		parts = append(parts, fmt.Sprintf("offsets topic %s will be created (compacted, one partition)", offsetsTopic))
	} else {
		parts = append(parts, fmt.Sprintf("offsets topic %s compacted, one partition", offsetsTopic))
	}
	return "transactions supported; " + strings.Join(parts, "; "), nil
}

// coordinatorWait bounds how long Check waits for a
// transaction coordinator: a broker that never served a transaction
// creates its transaction state topic on this first request, and answers
// COORDINATOR_NOT_AVAILABLE until it has.
const coordinatorWait = 30 * time.Second

// mayUseTransactionalID asks the transaction coordinator of id to describe
// it: a principal that may not is refused with
// TRANSACTIONAL_ID_AUTHORIZATION_FAILED; an id never used is not found,
// which says nothing against it. A coordinator that is not ready yet is
// asked again until coordinatorWait has passed.
func mayUseTransactionalID(ctx context.Context, cl *kgo.Client, id string) (bool, error) {
	deadline := time.Now().Add(coordinatorWait)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		ok, err := describeTransactionalID(ctx, cl, id)
		if err == nil || !kerr.IsRetriable(err) || time.Now().After(deadline) {
			return ok, err
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("%w (waiting since: %w)", ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// describeTransactionalID makes one DescribeTransactions request for id.
func describeTransactionalID(ctx context.Context, cl *kgo.Client, id string) (bool, error) {
	req := kmsg.NewPtrDescribeTransactionsRequest()
	req.TransactionalIDs = []string{id}
	for _, shard := range cl.RequestSharded(ctx, req) {
		if shard.Err != nil {
			if errors.Is(shard.Err, kerr.TransactionalIDAuthorizationFailed) {
				return false, nil
			}
			return false, fmt.Errorf("describe transactional id %s: %w", id, shard.Err)
		}
		resp := shard.Resp.(*kmsg.DescribeTransactionsResponse)
		for _, ts := range resp.TransactionStates {
			switch err := kerr.ErrorForCode(ts.ErrorCode); {
			case err == nil, errors.Is(err, kerr.TransactionalIDNotFound):
			case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
				return false, nil
			default:
				return false, fmt.Errorf("describe transactional id %s: %w", id, err)
			}
		}
	}
	return true, nil
}
