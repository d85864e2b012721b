package sink

import "github.com/walrelay/walrelay/event"

// ReasonForbiddenTopic is the dead-letter reason (HeaderReason) of an event
// routed to a topic it may not go to: one of walrelay's own, one of Kafka's
// internal topics, or one outside Config.AllowedTopics.
const ReasonForbiddenTopic = "forbidden_topic"

// Topic returns the topic an event is routed to.
func (s *Sink) Topic(e *event.Event) string { return s.records.Topic(e) }

// CheckTopic returns nil if an event may be routed to topic, and else why
// not: it is not a legal name, or it is walrelay's own, Kafka's internal or
// outside Config.AllowedTopics. The tools that produce to a topic read
// from a record (dlq replay) ask it first.
func (s *Sink) CheckTopic(topic string) error { return s.records.CheckTopic(topic) }
