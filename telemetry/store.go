package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// StoreHook returns a hook for redisstore.WithCallHook: a client span per
// script call, a child of the decision's context, with the store kind,
// the node's address (server.address), the policy and the outcome. It
// never records a key. For a nil Tracing it returns nil, which the store
// takes as no hook.
func (t *Tracing) StoreHook() func(ctx context.Context, store, node, policy string) (context.Context, func(allowed bool, err error)) {
	if t == nil {
		return nil
	}
	return func(ctx context.Context, store, node, policy string) (context.Context, func(bool, error)) {
		ctx, span := t.tracer.Start(ctx, spanStore, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(
				attribute.String("db.system.name", "redis"),
				attribute.String("db.operation.name", "EVALSHA"),
				attrStore.String(store),
				attribute.String("server.address", node),
				attrPolicy.String(policy),
			))
		return ctx, func(allowed bool, err error) {
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, "the store did not decide")
			} else {
				span.SetAttributes(attrAllowed.Bool(allowed))
			}
			span.End()
		}
	}
}
