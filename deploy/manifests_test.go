package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/server/config"
	"go.yaml.in/yaml/v3"
)

// k8sObject is what the test reads of a Kubernetes manifest.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Ports []struct {
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
		TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
		Template                      struct {
			Metadata struct {
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
					RunAsUser    int  `yaml:"runAsUser"`
					FSGroup      int  `yaml:"fsGroup"`
				} `yaml:"securityContext"`
				Containers []struct {
					Args  []string `yaml:"args"`
					Ports []struct {
						Name          string `yaml:"name"`
						ContainerPort int    `yaml:"containerPort"`
					} `yaml:"ports"`
					ReadinessProbe probe `yaml:"readinessProbe"`
					LivenessProbe  probe `yaml:"livenessProbe"`
					VolumeMounts   []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
				Volumes []struct {
					Name   string `yaml:"name"`
					Secret *struct {
						SecretName  string `yaml:"secretName"`
						DefaultMode int    `yaml:"defaultMode"`
					} `yaml:"secret"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// TestKubernetes parses deploy/kubernetes/slidegate.yaml and checks that
// its parts agree: the probes reach the admin listener's /readyz and
// /healthz on the port the configuration binds, an admin listener beyond
// loopback reads its token from a Secret, the Service reaches the main
// listener, the pod does not run as root, and the grace period covers the
// drain.
func TestKubernetes(t *testing.T) {
	dec := yaml.NewDecoder(strings.NewReader(readFile(t, "kubernetes/slidegate.yaml")))
	objs := map[string]k8sObject{}
	for {
		var o k8sObject
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		objs[o.Kind] = o
	}
	cm, dep, svc := objs["ConfigMap"], objs["Deployment"], objs["Service"]
	if cm.Kind == "" || dep.Kind == "" || svc.Kind == "" {
		t.Fatalf("want a ConfigMap, a Deployment and a Service; got %v", objs)
	}
	cfg, err := config.ParseConfig([]byte(cm.Data["slidegate.yaml"]))
	if err != nil {
		t.Fatalf("the ConfigMap's slidegate.yaml: %v", err)
	}
	drain, shutdown := config.DefaultDrainDelay, config.DefaultShutdownTimeout
	if cfg.DrainDelay != nil {
		drain = time.Duration(*cfg.DrainDelay)
	}
	if cfg.ShutdownTimeout != 0 {
		shutdown = time.Duration(cfg.ShutdownTimeout)
	}
	port := func(addr string) int {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(p)
		return n
	}
	pod := dep.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	named := map[string]int{}
	for _, p := range c.Ports {
		named[p.Name] = p.ContainerPort
	}
	if named["admin"] != port(cfg.Admin) || named["http"] != port(cfg.Listen) {
		t.Errorf("container ports %v, want admin %s and http %s from the configuration", named, cfg.Admin, cfg.Listen)
	}
	for _, pr := range []struct {
		name, path string
		p          probe
	}{{"readiness", "/readyz", c.ReadinessProbe}, {"liveness", "/healthz", c.LivenessProbe}} {
		if pr.p.HTTPGet.Path != pr.path || pr.p.HTTPGet.Port != "admin" {
			t.Errorf("%s probe %+v, want %s on the admin port", pr.name, pr.p.HTTPGet, pr.path)
		}
	}
	// Issue 40, point 4: an admin listener on the pod network needs a
	// token, read from a Secret that only the pod's group can read.
	// Annotation-based scraping sends no token: no such annotations.
	if host, _, _ := net.SplitHostPort(cfg.Admin); !isLoopback(host) {
		if cfg.AdminTokenFile == "" {
			t.Errorf("admin %s is beyond loopback without admin_token_file", cfg.Admin)
		}
		secretVolumes := map[string]int{}
		for _, v := range pod.Spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName != "" {
				secretVolumes[v.Name] = v.Secret.DefaultMode
			}
		}
		fromSecret := false
		for _, m := range c.VolumeMounts {
			if mode, ok := secretVolumes[m.Name]; ok && strings.HasPrefix(cfg.AdminTokenFile, strings.TrimSuffix(m.MountPath, "/")+"/") {
				fromSecret = true
				if mode&0o004 != 0 || mode&0o040 == 0 || pod.Spec.SecurityContext.FSGroup != pod.Spec.SecurityContext.RunAsUser {
					t.Errorf("the token's mode %#o with fsGroup %d: want readable by the pod's group (fsGroup, the user's), not by others", mode, pod.Spec.SecurityContext.FSGroup)
				}
			}
		}
		if !fromSecret {
			t.Errorf("admin_token_file %q is not in a volume mounted from a Secret", cfg.AdminTokenFile)
		}
		for k := range pod.Metadata.Annotations {
			if strings.HasPrefix(k, "prometheus.io/") {
				t.Errorf("annotation %s: annotation-based scraping sends no token", k)
			}
		}
	}
	if !pod.Spec.SecurityContext.RunAsNonRoot || pod.Spec.SecurityContext.RunAsUser == 0 {
		t.Errorf("pod security context %+v, want a non-root user", pod.Spec.SecurityContext)
	}
	if len(c.Args) < 3 || c.Args[0] != "serve" || c.Args[1] != "--config" || !strings.HasPrefix(c.Args[2], "/etc/slidegate/") {
		t.Errorf("args %q, want serve --config /etc/slidegate/…", c.Args)
	}
	if grace := time.Duration(pod.Spec.TerminationGracePeriodSeconds) * time.Second; grace <= drain+shutdown {
		t.Errorf("terminationGracePeriodSeconds %v does not cover drain_delay %v + shutdown_timeout %v", grace, drain, shutdown)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != "http" {
		t.Errorf("service ports %+v, want the http port", svc.Spec.Ports)
	}
}

// TestSystemdUnit reads deploy/systemd/slidegate.service: serve with a
// configuration file, reload by SIGHUP, a stop timeout covering the drain,
// no root.
func TestSystemdUnit(t *testing.T) {
	unit := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader([]byte(readFile(t, "systemd/slidegate.service"))))
	section := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("line %q is not key=value", line)
			}
			unit[section+"."+k] = v
		}
	}
	if f := strings.Fields(unit["Service.ExecStart"]); len(f) < 4 || f[1] != "serve" || f[2] != "--config" {
		t.Errorf("ExecStart %q, want slidegate serve --config FILE", unit["Service.ExecStart"])
	}
	if !strings.Contains(unit["Service.ExecReload"], "-HUP $MAINPID") {
		t.Errorf("ExecReload %q, want SIGHUP", unit["Service.ExecReload"])
	}
	stop, err := time.ParseDuration(unit["Service.TimeoutStopSec"])
	if err != nil || stop <= config.DefaultDrainDelay+config.DefaultShutdownTimeout {
		t.Errorf("TimeoutStopSec %q does not cover the default drain", unit["Service.TimeoutStopSec"])
	}
	if unit["Service.DynamicUser"] != "yes" || unit["Service.NoNewPrivileges"] != "yes" {
		t.Errorf("the unit runs with privileges: %v", unit)
	}
	if unit["Install.WantedBy"] != "multi-user.target" {
		t.Errorf("WantedBy %q", unit["Install.WantedBy"])
	}
}

// isLoopback reports whether host, of a listen address, is loopback.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && a.Unmap().IsLoopback()
}

// TestDockerfileAdminOnLoopback: the image's CMD
// keeps the admin listener on loopback (it has no token), its health
// check asks that address, and the admin port is not exposed.
func TestDockerfileAdminOnLoopback(t *testing.T) {
	var cmd []string
	var health, expose string
	for _, line := range strings.Split(readFile(t, "Dockerfile"), "\n") {
		switch {
		case strings.HasPrefix(line, "CMD "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "CMD ")), &cmd); err != nil {
				t.Fatalf("CMD %q: %v", line, err)
			}
		case strings.HasPrefix(strings.TrimSpace(line), "CMD ["):
			health = line
		case strings.HasPrefix(line, "EXPOSE "):
			expose = line
		}
	}
	admin := ""
	for i, a := range cmd {
		if a == "--admin" && i+1 < len(cmd) {
			admin = cmd[i+1]
		}
		if a == "--admin-token-file" || strings.HasPrefix(a, "--config") {
			t.Skipf("CMD %q configures the admin listener otherwise", cmd)
		}
	}
	host, port, err := net.SplitHostPort(admin)
	if err != nil || !isLoopback(host) {
		t.Errorf("CMD %q: --admin %q, want a loopback address (the image has no admin token)", cmd, admin)
	}
	if !strings.Contains(health, "http://"+admin+"/readyz") {
		t.Errorf("HEALTHCHECK %q does not ask the admin listener %s", health, admin)
	}
	for _, p := range strings.Fields(strings.TrimPrefix(expose, "EXPOSE ")) {
		if p == port {
			t.Errorf("%q exposes the admin port %s", expose, port)
		}
	}
}
