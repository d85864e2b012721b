package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Prune deletes the consumer's inbox rows processed more than olderThan
// ago, a thousand at a time, and returns how many it deleted. An event
// redelivered after its row was pruned is handled again: keep rows longer
// than any redelivery can come (the topics' retention).
func (c *Consumer) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	q := fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM %[1]s WHERE consumer = $1 AND processed_at < now() - make_interval(secs => $2) LIMIT 1000))`, c.table)
	var total int64
	for {
		tag, err := c.cfg.Postgres.Exec(ctx, q, c.cfg.Consumer, olderThan.Seconds())
		if err != nil {
			return total, fmt.Errorf("inbox: prune %s: %w", c.table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() == 0 {
			return total, nil
		}
	}
}

// checkRetention refuses a Retention shorter than what a topic read
// keeps: a record delivered again (a rebalance, a group whose offsets
// expired and reads from the start) after its inbox row was deleted would
// be handled twice. Kafka deletes a topic's records a segment at a time,
// once the segment's newest record is older than retention.ms, and a
// segment takes records until it rolls (segment.ms after its first): a
// record stays readable up to retention.ms + segment.ms (-1: for ever). A
// compacted topic (cleanup.policy compact without delete) keeps each
// key's latest for ever. A topic that does not exist yet is checked
// against the broker's defaults (log.retention.*, log.roll.*,
// log.cleanup.policy), which it takes when created without its own.
// Brokers that do not answer or refuse DescribeConfigs are not checked (a
// warning).
func (c *Consumer) checkRetention(ctx context.Context) error {
	if c.cfg.Retention < 0 {
		return nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.cfg.Brokers...)}, c.cfg.KafkaOpts...)...)
	if err != nil {
		return fmt.Errorf("inbox: kafka client: %w", err)
	}
	defer cl.Close()
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	cfgs, err := adm.DescribeTopicConfigs(dctx, c.cfg.Topics...)
	if err != nil {
		c.log.Warn("could not read the topics' retention.ms and segment.ms to check Retention against them", "topics", c.cfg.Topics, "retention", c.cfg.Retention, "err", err)
		return nil
	}
	var missing []string
	for _, rc := range cfgs {
		if rc.Err != nil {
			if errors.Is(rc.Err, kerr.UnknownTopicOrPartition) {
				missing = append(missing, rc.Name)
			} else {
				c.log.Warn("could not read a topic's retention.ms and segment.ms to check Retention against them", "topic", rc.Name, "retention", c.cfg.Retention, "err", rc.Err)
			}
			continue
		}
		v := configValues(rc.Configs)
		if err := c.retentionAgainst("topic "+rc.Name, v["cleanup.policy"], v["retention.ms"], v["segment.ms"]); err != nil {
			return err
		}
	}
	if len(missing) == 0 {
		return nil
	}
	bcfgs, err := adm.DescribeBrokerConfigs(dctx)
	if err == nil && len(bcfgs) > 0 && bcfgs[0].Err != nil {
		err = bcfgs[0].Err
	}
	if err != nil || len(bcfgs) == 0 {
		c.log.Warn("topics that do not exist yet: could not read the broker's defaults (log.retention.ms, log.roll.ms) to check Retention against what they will keep", "topics", missing, "retention", c.cfg.Retention, "err", err)
		return nil
	}
	v := configValues(bcfgs[0].Configs)
	retention := firstOf(v["log.retention.ms"], scaled(v["log.retention.minutes"], 60000), scaled(v["log.retention.hours"], 3600000))
	roll := firstOf(v["log.roll.ms"], scaled(v["log.roll.hours"], 3600000))
	return c.retentionAgainst("topic "+strings.Join(missing, ", ")+" (it does not exist yet: created without configs of its own, it takes the broker's defaults log.cleanup.policy, log.retention.ms, log.roll.ms)",
		v["log.cleanup.policy"], retention, roll)
}

// kafkaSegmentMs is Kafka's default segment.ms (log.roll.hours 168): 7
// days, taken when a topic's is not known.
const kafkaSegmentMs = 7 * 24 * 3600 * 1000

// retentionAgainst refuses Retention when what (a topic, or topics) keeps
// its records longer: by policy (compacted), or retention.ms + segment.ms
// (segment defaulting to Kafka's). An unknown retention is not checked.
func (c *Consumer) retentionAgainst(what, policy, retention, segment string) error {
	fix := "set Config.Retention to at least that, or negative to keep every row (and prune with Consumer.Prune)"
	if strings.Contains(policy, "compact") && !strings.Contains(policy, "delete") {
		return fmt.Errorf("inbox: %s is compacted (cleanup.policy=%s): it keeps each key's latest record for ever, longer than the inbox's Retention %s, so a record read again after its inbox row was deleted would be handled twice; %s", what, policy, c.cfg.Retention, fix)
	}
	ms, err := strconv.ParseInt(retention, 10, 64)
	if err != nil {
		return nil
	}
	if ms < 0 {
		return fmt.Errorf("inbox: %s keeps its records for ever (retention.ms=%d), longer than the inbox's Retention %s, so a record read again after its inbox row was deleted would be handled twice; %s", what, ms, c.cfg.Retention, fix)
	}
	seg, err := strconv.ParseInt(segment, 10, 64)
	if err != nil || seg < 0 {
		seg = kafkaSegmentMs
	}
	if kept := time.Duration(ms+seg) * time.Millisecond; kept > c.cfg.Retention {
		return fmt.Errorf("inbox: %s keeps its records up to %s (retention.ms=%d, plus segment.ms=%d: a record is deleted with its segment, which takes records for segment.ms before it rolls), longer than the inbox's Retention %s, so a record read again after its inbox row was deleted would be handled twice; %s", what, kept, ms, seg, c.cfg.Retention, fix)
	}
	return nil
}

// configValues maps the configs that have a value to it.
func configValues(cfgs []kadm.Config) map[string]string {
	v := make(map[string]string, len(cfgs))
	for _, cf := range cfgs {
		if cf.Value != nil {
			v[cf.Key] = *cf.Value
		}
	}
	return v
}

// scaled is the number of s times unit, as text, or "" if s is not a
// number.
func scaled(s string, unit int64) string {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return ""
	}
	if n < 0 {
		return "-1"
	}
	return strconv.FormatInt(n*unit, 10)
}

// firstOf is the first of vs that is not empty.
func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// retain deletes the inbox rows older than Retention until ctx ends: at
// once, then every Retention/24 (an hour at most).
func (c *Consumer) retain(ctx context.Context) {
	every := min(c.cfg.Retention/24, time.Hour)
	for {
		n, err := c.Prune(ctx, c.cfg.Retention)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			c.log.Warn("delete the inbox rows past retention; trying again later", "retention", c.cfg.Retention, "err", err)
		case n > 0:
			c.log.Info("deleted the inbox rows past retention", "rows", n, "retention", c.cfg.Retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
