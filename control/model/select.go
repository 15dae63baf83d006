package model

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// Labels and annotations the model reads.
const (
	// LabelServiceProxyName names the proxy that handles a Service; Services
	// without it belong to the default proxy.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless marks headless Services and their EndpointSlices.
	LabelHeadless = corev1.IsHeadlessService
	// AnnotationWeight on an EndpointSlice sets the weight of every endpoint
	// in it: a decimal integer from 1 to MaxWeight, default 1. Endpoints
	// share a service's new flows in proportion to their weights. Invalid
	// values are reported and the default is used. (Slices managed by the
	// EndpointSlice controller are rewritten by it; the annotation is meant
	// for slices that users or other controllers manage.)
	AnnotationWeight = "xdplb.io/weight"
	// MaxWeight is the largest accepted AnnotationWeight.
	MaxWeight = 65535
)

// LabelSelector selects the Services, and the EndpointSlices (which carry
// their Service's labels), that the proxy named proxyName handles: not
// headless, and labelled with proxyName, or unlabelled when proxyName is "".
// Use it on informers; Compute applies the same rule again.
func LabelSelector(proxyName string) labels.Selector {
	notHeadless, err1 := labels.NewRequirement(LabelHeadless, selection.DoesNotExist, nil)
	var proxy *labels.Requirement
	var err2 error
	if proxyName == "" {
		proxy, err2 = labels.NewRequirement(LabelServiceProxyName, selection.DoesNotExist, nil)
	} else {
		proxy, err2 = labels.NewRequirement(LabelServiceProxyName, selection.Equals, []string{proxyName})
	}
	if err1 != nil || err2 != nil {
		// proxyName is not a valid label value, so no object carries it.
		return labels.Nothing()
	}
	return labels.NewSelector().Add(*notHeadless, *proxy)
}

// Selected reports whether an object with these labels is handled by the
// proxy named proxyName; it is the rule of LabelSelector.
func Selected(objLabels map[string]string, proxyName string) bool {
	if _, ok := objLabels[LabelHeadless]; ok {
		return false
	}
	name, ok := objLabels[LabelServiceProxyName]
	if proxyName == "" {
		return !ok
	}
	return ok && name == proxyName
}
