package deploy_test

import (
	"archive/tar"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// podman runs podman with its storage under dir: the test's images never
// touch the machine's own.
func podman(t *testing.T, bin, dir string, args ...string) (string, error) {
	t.Helper()
	base := []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--storage-driver", "vfs"}
	cmd := exec.Command(bin, append(base, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestImage builds the image of deploy/Dockerfile with podman from a
// static binary, and checks what the Dockerfile promises: one file, not
// root, no shell, the health check on the admin listener's /readyz; then
// runs it where this machine lets podman run containers.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and an image")
	}
	pm := need(t, "podman")
	dir, err := os.MkdirTemp("", "slidegate-image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// podman's helper processes can still write its storage for a
		// moment after a command returns, which makes one RemoveAll fail.
		for range 50 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("podman's storage %s is left behind: %v", dir, os.RemoveAll(dir))
	})
	ctxDir := filepath.Join(dir, "context")
	bin := filepath.Join(ctxDir, "slidegate")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/slidegate")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	checkStatic(t, bin)

	tag := fmt.Sprintf("localhost/slidegate-test:%d", time.Now().UnixNano())
	if out, err := podman(t, pm, dir, "build", "--format", "docker", "-f", "Dockerfile", "-t", tag, ctxDir); err != nil {
		t.Fatalf("podman build: %v\n%s", err, out)
	}
	out, err := podman(t, pm, dir, "image", "inspect", tag)
	if err != nil {
		t.Fatalf("podman image inspect: %v\n%s", err, out)
	}
	var imgs []struct {
		Config struct {
			User       string
			Entrypoint []string
			Cmd        []string
		}
		HealthCheck struct{ Test []string }
	}
	if err := json.Unmarshal([]byte(out), &imgs); err != nil || len(imgs) != 1 {
		t.Fatalf("image inspect: %v\n%s", err, out)
	}
	img := imgs[0]
	if img.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (not root)", img.Config.User)
	}
	if want := []string{"CMD", "/slidegate", "health", "http://127.0.0.1:9090/readyz"}; strings.Join(img.HealthCheck.Test, " ") != strings.Join(want, " ") {
		t.Errorf("health check %q, want %q", img.HealthCheck.Test, want)
	}
	if strings.Join(img.Config.Entrypoint, " ") != "/slidegate" || len(img.Config.Cmd) == 0 || img.Config.Cmd[0] != "serve" {
		t.Errorf("entrypoint %q cmd %q, want /slidegate serve …", img.Config.Entrypoint, img.Config.Cmd)
	}
	files := imageFiles(t, pm, dir, tag)
	if len(files) != 1 || files["slidegate"]&0o005 != 0o005 {
		t.Errorf("image files %v, want only slidegate, readable and executable by the unprivileged user (so no shell)", files)
	}

	t.Run("Run", func(t *testing.T) {
		out, err := podman(t, pm, dir, "run", "--rm", "--no-healthcheck", "--network", "host", tag, "version")
		if err != nil {
			if strings.Contains(out, "setrlimit") || strings.Contains(out, "OCI permission denied") {
				t.Skipf("this machine's sandbox refuses podman run (%s): the image was built and inspected, not run", firstLine(out))
			}
			t.Fatalf("podman run version: %v\n%s", err, out)
		}
		if !strings.Contains(out, "slidegate") {
			t.Fatalf("podman run version printed %q", out)
		}
		listen, admin := freeAddr(t), freeAddr(t)
		name := strings.ReplaceAll(strings.TrimPrefix(tag, "localhost/"), ":", "-")
		if out, err := podman(t, pm, dir, "run", "-d", "--name", name, "--network", "host", tag, "serve", "--listen", listen, "--admin", admin, "--drain-delay", "0s"); err != nil {
			t.Fatalf("podman run serve: %v\n%s", err, out)
		}
		t.Cleanup(func() { _, _ = podman(t, pm, dir, "rm", "-f", "-t", "5", name) })
		deadline := time.Now().Add(time.Minute)
		for {
			resp, err := http.Get("http://" + admin + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				logs, _ := podman(t, pm, dir, "logs", name)
				t.Fatalf("the container's /readyz did not answer 200 in a minute (%v); logs:\n%s", err, logs)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if out, err := podman(t, pm, dir, "exec", name, "/slidegate", "health", "http://"+admin+"/readyz"); err != nil {
			t.Errorf("the health check inside the container: %v\n%s", err, out)
		}
	})
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndex(s, "\n"); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// checkStatic fails unless path is an ELF executable with no dynamic
// loader and no shared libraries: it runs on an empty base.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s has a dynamic loader: not static", path)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("%s needs shared libraries %v", path, libs)
	}
}

// imageFiles lists the regular files of image tag's layers with their
// modes, from podman save's docker archive.
func imageFiles(t *testing.T, pm, dir, tag string) map[string]os.FileMode {
	t.Helper()
	archive := filepath.Join(dir, "image.tar")
	if out, err := podman(t, pm, dir, "save", "--format", "docker-archive", "-o", archive, tag); err != nil {
		t.Fatalf("podman save: %v\n%s", err, out)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The archive holds manifest.json and one tar per layer.
	entries := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			entries[h.Name] = b
		}
	}
	var manifest []struct{ Layers []string }
	if err := json.Unmarshal(entries["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v", err)
	}
	files := map[string]os.FileMode{}
	for _, l := range manifest[0].Layers {
		lr := tar.NewReader(strings.NewReader(string(entries[l])))
		for {
			h, err := lr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", l, err)
			}
			files[strings.TrimPrefix(h.Name, "./")] = h.FileInfo().Mode()
		}
	}
	return files
}
