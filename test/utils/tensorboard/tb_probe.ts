// Child of tb_errors.test.ts: log one scalar to TENSORBOARD_DIR=argv[2], print the error's code and message.
import { TensorboardBackend } from "../../../src/utils/tensorboard/backend.js";

process.env.VERL_LOG_LEVEL = "fatal";
process.env.TENSORBOARD_DIR = process.argv[2];
try {
  new TensorboardBackend("p", "e").log({ a: 1 }, 1);
  console.log("no error");
} catch (e) {
  console.log(`${(e as { code?: string }).code} ${(e as Error).message}`);
}
