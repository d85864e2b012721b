package record

import "testing"

// TestTopicRules: the rules reserve the offsets topic of exactly-once
// mode, the configured dead-letter topic and the other reserved topics
// whatever the allowed topics say, and Kafka's internal names.
func TestTopicRules(t *testing.T) {
	t.Parallel()
	r, err := newTopicRules(Config{DLQTopic: "app.dlq", ReservedTopics: []string{"old.offsets"}, OffsetsTopic: "app.offsets", AllowedTopics: []string{"app.*"}})
	if err != nil {
		t.Fatal(err)
	}
	for topic, ok := range map[string]bool{
		"app.orders": true, "app.dlq": false, "app.offsets": false, "old.offsets": false, "walrelay.dlq": false,
		"walrelay.inbox.dlq": false, "__transaction_state": false, "other.orders": false, "app": false,
	} {
		if err := r.check(topic); (err == nil) != ok {
			t.Errorf("%s: %v, want allowed %v", topic, err, ok)
		}
	}
	if _, err := newTopicRules(Config{OffsetsTopic: "app.offsets", AllowedTopics: []string{"app.offsets"}}); err == nil {
		t.Error("the offsets topic accepted as an allowed topic")
	}
}
