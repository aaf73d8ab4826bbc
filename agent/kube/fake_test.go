package kube

import (
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodectl/nodectl/agent/kube/kubefake"
)

func newFake(objs ...runtime.Object) kubefake.Clientset { return kubefake.New(objs...) }
