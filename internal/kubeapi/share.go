package kubeapi

import "context"

// A share is whose turn a request to the API server waits for in the
// node's token bucket (fairlimit.go): the namespace it is made for, and
// whether it is a pod status write, which goes first. Requests made without
// one (watches, lists, probes) share the bucket as the node's own, under the
// namespace "".
type share struct {
	namespace string
	podStatus bool
}

type shareKey struct{}

// ForNamespace tags ctx's requests as made for namespace ns: they take
// their turns with those of other namespaces, round-robin, so the requests
// of one namespace do not delay another's beyond their share.
func ForNamespace(ctx context.Context, ns string) context.Context {
	return context.WithValue(ctx, shareKey{}, share{namespace: ns})
}

// forPodStatus tags ctx's requests as the pod status writes of namespace
// ns: they go before every other request waiting in the bucket.
func forPodStatus(ctx context.Context, ns string) context.Context {
	return context.WithValue(ctx, shareKey{}, share{namespace: ns, podStatus: true})
}

func shareOf(ctx context.Context) share {
	s, _ := ctx.Value(shareKey{}).(share)
	return s
}
