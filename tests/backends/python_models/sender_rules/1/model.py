"""Uses the response sender as PLAN says, to check the rules Triton enforces on it.

PLAN (INT32 [6]): responses sent before returning, FINAL before returning (0/1),
a response returned from ``execute`` (0/1), responses sent by a thread after
returning, FINAL from that thread (0/1), and what ``execute`` returns instead of
a list (0: a list, 1: a tuple, 2: a list holding an int). OUT is 100 + n for the
n-th response sent before returning, 0 for the returned one, 200 + n after
returning. Every error ``send`` raises is kept in ``refusals``. The thread sends
once ``delivered`` is set: the test sets it when ``execute`` has returned and the
backend has delivered what it returned.
"""

import threading

import numpy as np

import triton_python_backend_utils as pb_utils


def _response(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        self.refusals = []
        self.threads = []
        self.delivered = threading.Event()

    def _send_all(self, sender, count, offset, final):
        for n in range(count):
            sender.send(_response(offset + n))
        if final:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _later(self, sender, count, final):
        self.delivered.wait(30)  # after execute has returned and its results were delivered
        try:
            self._send_all(sender, count, 200, final)
        except pb_utils.TritonModelException as error:
            self.refusals.append(str(error))

    def execute(self, requests):
        self.delivered.clear()
        returned = []
        shape = 0
        for request in requests:
            pre, final_pre, answer, post, final_post, shape = (
                int(v) for v in pb_utils.get_input_tensor_by_name(request, "PLAN").as_numpy()
            )
            sender = request.get_response_sender()
            try:
                self._send_all(sender, pre, 100, final_pre)
            except pb_utils.TritonModelException as error:
                self.refusals.append(str(error))
                raise
            if post or final_post:
                thread = threading.Thread(target=self._later, args=(sender, post, final_post))
                self.threads.append(thread)
            returned.append(_response(0) if answer else None)
        for thread in self.threads:
            thread.start()
        if shape == 1:
            return tuple(returned)
        if shape == 2:
            return [1 for _ in requests]
        return None if all(r is None for r in returned) else returned

    def join(self):
        for thread in self.threads:
            thread.join()
        self.threads = []
