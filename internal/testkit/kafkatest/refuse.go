package kafkatest

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Refusal is the broker's answer to req with code in every place the
// request kind carries one, for tests that have a healthy broker refuse a
// kind of request for a while: Produce, Metadata (a topic's error; the
// brokers are echoed from brokers, so that the client keeps them),
// FindCoordinator, InitProducerID, EndTxn and Fetch (the answer's own
// error). ok is false for another kind, or a
// Metadata request for all topics (it has no place for an error): let the
// broker answer those.
func Refusal(req kmsg.Request, code int16, brokers []kmsg.MetadataResponseBroker) (resp kmsg.Response, ok bool) {
	switch r := req.(type) {
	case *kmsg.ProduceRequest:
		return RefuseProduce(r, code), true
	case *kmsg.MetadataRequest:
		if r.Topics == nil {
			return nil, false
		}
		resp := r.ResponseKind().(*kmsg.MetadataResponse)
		resp.Brokers = brokers
		resp.ControllerID = -1
		for _, t := range r.Topics {
			rt := kmsg.NewMetadataResponseTopic()
			rt.Topic, rt.TopicID, rt.ErrorCode = t.Topic, t.TopicID, code
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, true
	case *kmsg.FindCoordinatorRequest:
		resp := r.ResponseKind().(*kmsg.FindCoordinatorResponse)
		resp.ErrorCode, resp.NodeID = code, -1
		keys := r.CoordinatorKeys
		if r.Version < 4 {
			keys = []string{r.CoordinatorKey}
		}
		for _, k := range keys {
			c := kmsg.NewFindCoordinatorResponseCoordinator()
			c.Key, c.ErrorCode, c.NodeID = k, code, -1
			resp.Coordinators = append(resp.Coordinators, c)
		}
		return resp, true
	case *kmsg.InitProducerIDRequest:
		resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode, resp.ProducerID, resp.ProducerEpoch = code, -1, -1
		return resp, true
	case *kmsg.EndTxnRequest:
		resp := r.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = code
		return resp, true
	case *kmsg.FetchRequest:
		// The answer's own error (v7+), as a broker gives for the fetch
		// as a whole.
		resp := r.ResponseKind().(*kmsg.FetchResponse)
		resp.ErrorCode = code
		return resp, true
	}
	return nil, false
}
