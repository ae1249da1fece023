// The translation unit that compiles the precompiled LibTorch header (CMakeLists.txt,
// PIPETRAIN_PCH); it defines nothing.
