package loadtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
)

// mutexFraction is the mutex profile's sampling rate while profiling: one
// contention event in this many is recorded.
const mutexFraction = 5

// profiler writes the profiles a run asked for: whole-run files
// (--cpuprofile, --memprofile, --mutexprofile) and per-phase files under
// --profile-dir. Only one CPU profile can run at a time, so per-phase CPU
// profiles are taken only when no whole-run CPU profile is.
type profiler struct {
	cfg   Config
	cpu   *os.File // whole-run CPU profile
	phase *os.File // current phase's CPU profile
	files map[string]string
	err   error
}

func startProfiler(cfg Config) (*profiler, error) {
	p := &profiler{cfg: cfg, files: map[string]string{}}
	if cfg.MutexProfile != "" || cfg.ProfileDir != "" {
		runtime.SetMutexProfileFraction(mutexFraction)
	}
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return nil, fmt.Errorf("loadtest: --profile-dir: %w", err)
		}
	}
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return nil, fmt.Errorf("loadtest: --cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("loadtest: --cpuprofile: %w", err)
		}
		p.cpu = f
		p.files["cpuprofile"] = cfg.CPUProfile
	}
	return p, nil
}

func (p *profiler) keep(err error) {
	if err != nil && p.err == nil {
		p.err = err
	}
}

// beginPhase starts the phase's CPU profile under --profile-dir.
func (p *profiler) beginPhase(name string) {
	if p == nil || p.cfg.ProfileDir == "" || p.cpu != nil {
		return
	}
	path := filepath.Join(p.cfg.ProfileDir, name+"-cpu.pprof")
	f, err := os.Create(path)
	if err != nil {
		p.keep(fmt.Errorf("loadtest: profile: %w", err))
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		p.keep(fmt.Errorf("loadtest: profile: %w", err))
		return
	}
	p.phase = f
	p.files[name+"-cpu"] = path
}

// heap writes the phase's heap profile; phases call it while their state
// is still alive, so that inuse_space shows what the phase retains.
func (p *profiler) heap(name string) {
	if p == nil || p.cfg.ProfileDir == "" {
		return
	}
	path := filepath.Join(p.cfg.ProfileDir, name+"-heap.pprof")
	p.keep(writeProfile("heap", path, true))
	p.files[name+"-heap"] = path
}

// endPhase stops the phase's CPU profile and writes its mutex profile
// (cumulative since the run began: the runtime cannot reset it).
func (p *profiler) endPhase(name string) {
	if p == nil {
		return
	}
	if p.phase != nil {
		pprof.StopCPUProfile()
		p.keep(p.phase.Close())
		p.phase = nil
	}
	if p.cfg.ProfileDir != "" {
		path := filepath.Join(p.cfg.ProfileDir, name+"-mutex.pprof")
		p.keep(writeProfile("mutex", path, false))
		p.files[name+"-mutex"] = path
	}
}

// stop ends the whole-run profiles and returns the first error met.
func (p *profiler) stop() error {
	if p.cpu != nil {
		pprof.StopCPUProfile()
		p.keep(p.cpu.Close())
		p.cpu = nil
	}
	if p.cfg.MemProfile != "" {
		p.keep(writeProfile("heap", p.cfg.MemProfile, true))
		p.files["memprofile"] = p.cfg.MemProfile
	}
	if p.cfg.MutexProfile != "" {
		p.keep(writeProfile("mutex", p.cfg.MutexProfile, false))
		p.files["mutexprofile"] = p.cfg.MutexProfile
	}
	if p.cfg.MutexProfile != "" || p.cfg.ProfileDir != "" {
		runtime.SetMutexProfileFraction(0)
	}
	return p.err
}

func writeProfile(name, path string, gc bool) error {
	if gc {
		runtime.GC() // up-to-date inuse figures
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("loadtest: profile: %w", err)
	}
	err = pprof.Lookup(name).WriteTo(f, 0)
	return errors.Join(err, f.Close())
}
