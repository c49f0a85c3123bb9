/* gemmtune.api._signature: the key of tuned_gemm's plan cache, read in one C call.
 *
 * A cached tuned_gemm call finds its plan by what its tensors say about themselves: rank,
 * dtype, device, shape and strides. Read from Python, that is eight or more attribute reads
 * and method calls on torch tensors, each a trip through torch's argument parsing; here it is
 * one call that fills a DLTensor per tensor through the DLPack exchange API torch publishes
 * on `torch.Tensor.__dlpack_c_exchange_api__` (a table of C functions, no torch headers
 * needed) and packs the facts into one bytes object, which Python hashes and compares as a
 * dictionary key.
 *
 *   bind(capsule) -> bool            take the exchange API; False where its ABI is not DLPack 1.x
 *   tensor_signature(*tensors) -> bytes | None
 *                                    None where a tensor is not one the API reads (the caller
 *                                    then reads the same facts from Python)
 *
 * The structs below are DLPack's stable ABI (dlpack.h, major version 1), declared here so the
 * extension builds with nothing but Python's headers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;

typedef struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  struct DLPackExchangeAPIHeader *prev_api;
} DLPackExchangeAPIHeader;

typedef int (*DLTensorFromPyObjectNoSync)(void *py_object, DLTensor *out);

typedef struct {
  DLPackExchangeAPIHeader header;
  void *managed_tensor_allocator;
  void *managed_tensor_from_py_object_no_sync;
  void *managed_tensor_to_py_object_no_sync;
  DLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync;
  void *current_work_stream;
} DLPackExchangeAPI;

/* a, b, out and a bias: the most tensors a call passes */
#define MAX_TENSORS 4
/* tuned_gemm multiplies 2-D and 3-D tensors; a rank beyond this is read from Python */
#define MAX_RANK 8
/* per tensor: two words of rank, dtype and device, then a shape and a stride per dimension */
#define WORDS_PER_TENSOR (2 + 2 * MAX_RANK)

static const DLPackExchangeAPI *exchange_api = NULL;

static PyObject *bind(PyObject *self, PyObject *capsule) {
  const DLPackExchangeAPI *api = PyCapsule_GetPointer(capsule, "dlpack_exchange_api");
  if (api == NULL) {
    return NULL;
  }
  if (api->header.version.major != 1 || api->dltensor_from_py_object_no_sync == NULL) {
    Py_RETURN_FALSE;
  }
  exchange_api = api;
  Py_RETURN_TRUE;
}

static PyObject *tensor_signature(PyObject *self, PyObject *const *tensors, Py_ssize_t count) {
  int64_t words[MAX_TENSORS * WORDS_PER_TENSOR];
  Py_ssize_t used = 0;
  if (exchange_api == NULL || count > MAX_TENSORS) {
    Py_RETURN_NONE;
  }
  for (Py_ssize_t i = 0; i < count; i++) {
    DLTensor tensor;
    if (exchange_api->dltensor_from_py_object_no_sync(tensors[i], &tensor) != 0) {
      PyErr_Clear();
      Py_RETURN_NONE;
    }
    if (tensor.ndim < 0 || tensor.ndim > MAX_RANK) {
      Py_RETURN_NONE;
    }
    words[used++] = (int64_t)tensor.ndim | ((int64_t)tensor.dtype.code << 8) |
                    ((int64_t)tensor.dtype.bits << 16) | ((int64_t)tensor.dtype.lanes << 32);
    words[used++] = (int64_t)tensor.device.device_type | ((int64_t)tensor.device.device_id << 32);
    for (int32_t d = 0; d < tensor.ndim; d++) {
      words[used++] = tensor.shape[d];
      /* DLPack allows NULL strides for a compact row-major tensor; torch always fills them,
         and -1 (no stride is negative in torch) keeps the two cases apart */
      words[used++] = tensor.strides != NULL ? tensor.strides[d] : -1;
    }
  }
  return PyBytes_FromStringAndSize((const char *)words, used * (Py_ssize_t)sizeof(int64_t));
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "Take torch's DLPack exchange API capsule; False if its ABI differs."},
    {"tensor_signature", (PyCFunction)(void (*)(void))tensor_signature, METH_FASTCALL,
     "Rank, dtype, device, shape and strides of each tensor, as one bytes key (None where a "
     "tensor cannot be read)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_signature", "tuned_gemm's plan-cache key in one C call", -1, methods,
};

PyMODINIT_FUNC PyInit__signature(void) { return PyModule_Create(&module); }
