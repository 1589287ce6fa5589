/* What _pn.c and _values.c share to call proton's C functions directly: the library cffi already loaded (not a
 * second copy, whose engine objects would not be cffi's), and its functions found by name. */
#ifndef HAQUEUE_PROTON_LIB_H
#define HAQUEUE_PROTON_LIB_H

#include <Python.h>
#include <dlfcn.h>

typedef struct { size_t size; const char *start; } pn_bytes;

/* The loaded library at `path`, or NULL with ImportError set. */
static void *proton_library(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL)
        PyErr_Format(PyExc_ImportError, "cannot find the loaded proton library %s: %s", path, dlerror());
    return lib;
}

/* var = the function `name` of `lib` (loaded from `path`); else return NULL with ImportError set. */
#define FIND(var, name)                                                                            \
    do {                                                                                           \
        *(void **)(&var) = dlsym(lib, name);                                                       \
        if (var == NULL) {                                                                         \
            PyErr_Format(PyExc_ImportError, "proton function %s not found in %s", name, path);     \
            return NULL;                                                                           \
        }                                                                                          \
    } while (0)

#endif
