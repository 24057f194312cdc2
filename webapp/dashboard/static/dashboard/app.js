/* The dashboard's only script: plain JavaScript, no build step, served from /static/. */
"use strict";

(function () {
  const MIN_POLL_GAP_MS = 1000; // never more than one status request a second
  const WAIT_SECONDS = 10;

  function csrfToken() {
    const input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  async function postJson(url, body) {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify(body || {}),
    });
    let data = {};
    try { data = await response.json(); } catch (e) { data = {}; }
    return { ok: response.ok, status: response.status, data: data };
  }

  function sleep(ms) { return new Promise((resolve) => setTimeout(resolve, ms)); }

  function isFinished(job) { return ["succeeded", "failed", "canceled", "expired"].includes(job.status); }

  /* Long-polls a job until it finishes, calling onChange with every new state. */
  async function follow(job, onChange, shouldStop) {
    let last = 0;
    while (!isFinished(job) && !(shouldStop && shouldStop())) {
      const gap = Date.now() - last;
      if (gap < MIN_POLL_GAP_MS) await sleep(MIN_POLL_GAP_MS - gap);
      last = Date.now();
      try {
        const response = await fetch(`/app/jobs/${job.id}/?wait=${WAIT_SECONDS}`, { credentials: "same-origin" });
        if (!response.ok) throw new Error(`status ${response.status}`);
        job = await response.json();
      } catch (e) {
        await sleep(3000); // the server or network hiccuped: try again shortly
        continue;
      }
      onChange(job);
    }
    return job;
  }

  /* Seconds for people, as the pages' duration filter writes them: 0.8 s, 42 s, 3 min 05 s, 1 h 02 min. */
  function formatSeconds(s) {
    if (s === null || s === undefined || !Number.isFinite(s)) return "";
    s = Math.max(0, s);
    if (s < 10 && !Number.isInteger(s)) return `${s.toFixed(1)} s`;
    s = Math.round(s);
    if (s < 60) return `${s} s`;
    const minutes = Math.floor(s / 60);
    if (minutes < 60) return `${minutes} min ${String(s % 60).padStart(2, "0")} s`;
    return `${Math.floor(minutes / 60).toLocaleString("en-US")} h ${String(minutes % 60).padStart(2, "0")} min`;
  }

  function describe(job) {
    if (job.status === "queued") {
      const pos = job.queue_position ? `position ${job.queue_position} in the queue` : "waiting for a worker";
      const eta = job.eta_seconds !== null && job.eta_seconds !== undefined ? `, ready in about ${formatSeconds(job.eta_seconds)}` : "";
      return `Queued: ${pos}${eta}.`;
    }
    if (job.status === "running") {
      const eta = job.eta_seconds !== null && job.eta_seconds !== undefined ? `, about ${formatSeconds(job.eta_seconds)} left` : "";
      return `Speaking: ${Math.round(job.progress * 100)}% done${eta}.`;
    }
    if (job.status === "succeeded") return "Done.";
    if (job.status === "canceled") return "Canceled.";
    if (job.error) return `Failed: ${job.error.message}`;
    return job.status;
  }

  function drawWaveform(canvas, buffer) {
    const ctx = canvas.getContext("2d");
    const data = buffer.getChannelData(0);
    const width = canvas.width, height = canvas.height, mid = height / 2;
    const step = Math.max(1, Math.floor(data.length / width));
    const color = getComputedStyle(canvas).color || "#2563eb";
    ctx.clearRect(0, 0, width, height);
    ctx.fillStyle = color;
    for (let x = 0; x < width; x++) {
      let min = 1, max = -1;
      for (let i = x * step; i < Math.min(data.length, (x + 1) * step); i++) {
        if (data[i] < min) min = data[i];
        if (data[i] > max) max = data[i];
      }
      if (min > max) break;
      ctx.fillRect(x, mid + min * mid, 1, Math.max(1, (max - min) * mid));
    }
  }

  /* Fetches the audio, decodes it in the page (duration, waveform) and hands it to the player. */
  async function showAudio(job, player, canvas, durationLabel) {
    const response = await fetch(job.audio_url, { credentials: "same-origin" });
    const bytes = await response.arrayBuffer();
    const blob = new Blob([bytes], { type: response.headers.get("Content-Type") || "audio/wav" });
    player.src = URL.createObjectURL(blob);
    const context = new (window.AudioContext || window.webkitAudioContext)();
    const buffer = await context.decodeAudioData(bytes.slice(0));
    player.dataset.decodedDuration = String(buffer.duration);
    if (canvas) drawWaveform(canvas, buffer);
    if (durationLabel) durationLabel.textContent = formatSeconds(buffer.duration);
    context.close();
  }

  function clearErrors(form) {
    form.querySelectorAll(".error").forEach((el) => { el.hidden = true; el.textContent = ""; });
    form.querySelectorAll("[aria-invalid]").forEach((el) => el.removeAttribute("aria-invalid"));
    const excerpt = document.getElementById("text-excerpt");
    if (excerpt) { excerpt.hidden = true; excerpt.textContent = ""; }
  }

  /* A refused request's problem+json (as the API answers): what showError needs of it. */
  function problemOf(answer) {
    const data = answer.data || {};
    return { message: data.detail || `Error ${answer.status}`, field: data.field, position: data.position, code: data.code };
  }

  /* An error goes next to its field; an annotation error also marks its place in the text. */
  function showError(form, error) {
    const field = error.field && form.querySelector(`#${CSS.escape(error.field)}`) ? error.field : null;
    const target = document.getElementById(field ? `${field}-error` : "form-error");
    target.textContent = error.message || "Something went wrong.";
    target.hidden = false;
    if (field) {
      const input = form.querySelector(`#${CSS.escape(field)}`);
      input.setAttribute("aria-invalid", "true");
      input.focus();
      if (field === "text" && Number.isInteger(error.position)) markPosition(input, error.position);
    }
  }

  function markPosition(textarea, position) {
    const chars = Array.from(textarea.value);
    const excerpt = document.getElementById("text-excerpt");
    const start = Math.max(0, position - 20);
    excerpt.textContent = "";
    excerpt.append(document.createTextNode(`At character ${position + 1}: …${chars.slice(start, position).join("")}`));
    const mark = document.createElement("mark");
    mark.textContent = chars[position] || " ";
    excerpt.append(mark, document.createTextNode(`${chars.slice(position + 1, position + 20).join("")}…`));
    excerpt.hidden = false;
    const offset = chars.slice(0, position).join("").length; // UTF-16 offset for the selection
    textarea.setSelectionRange(offset, offset + (chars[position] || "").length);
  }

  function readForm(form) {
    const speed = parseFloat(form.speed.value);
    return {
      text: form.text.value,
      voice: form.voice.value,
      format: form.format.value,
      speed: Number.isFinite(speed) ? speed : null,
      instructions: form.instructions.value.trim() || null,
    };
  }

  function setupCounter(form) {
    const text = form.querySelector("#text");
    const count = document.getElementById("char-count");
    const max = parseInt(form.dataset.maxChars, 10);
    const left = parseInt(form.dataset.monthlyLeft, 10);
    const update = () => {
      const n = Array.from(text.value).length;
      count.textContent = n.toLocaleString("en-US");
      count.parentElement.classList.toggle("over", n > max || n > left);
    };
    text.addEventListener("input", update);
    update();
  }

  function setupSynthesize() {
    const form = document.getElementById("synth-form");
    if (!form) return;
    setupCounter(form);
    const section = document.getElementById("job");
    const progress = document.getElementById("progress");
    const status = document.getElementById("job-status");
    const cancel = document.getElementById("cancel");
    const result = document.getElementById("job-result");
    const submit = document.getElementById("submit");
    let current = null;

    const render = (job) => {
      current = job;
      progress.value = Math.round(job.progress * 100);
      progress.textContent = `${progress.value}%`;
      progress.dataset.seen = `${progress.dataset.seen || ""} ${progress.value}`.trim();
      status.textContent = describe(job);
      section.dataset.status = job.status;
      cancel.hidden = isFinished(job);
    };

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      clearErrors(form);
      submit.disabled = true;
      const answer = await postJson(form.dataset.submitUrl, readForm(form));
      submit.disabled = false;
      if (!answer.ok) { showError(form, problemOf(answer)); return; }
      section.hidden = false;
      result.hidden = true;
      progress.dataset.seen = "";
      render(answer.data);
      const done = await follow(answer.data, render);
      render(done);
      if (done.status === "succeeded") {
        await showAudio(done, document.getElementById("player"), document.getElementById("waveform"), document.getElementById("duration"));
        document.getElementById("download").href = done.download_url;
        result.hidden = false;
      }
    });

    cancel.addEventListener("click", async () => {
      if (!current) return;
      const answer = await postJson(`/app/jobs/${current.id}/cancel/`);
      if (answer.ok) render(answer.data);
      else status.textContent = problemOf(answer).message || "Could not cancel.";
    });

    const preview = document.getElementById("preview");
    preview.addEventListener("click", async () => {
      clearErrors(form);
      const voice = form.voice;
      const name = voice.options[voice.selectedIndex].text;
      preview.disabled = true;
      const answer = await postJson(form.dataset.submitUrl, { text: `Hello, this is ${name}.`, voice: voice.value, format: "wav" });
      if (!answer.ok) { preview.disabled = false; showError(form, problemOf(answer)); return; }
      const done = await follow(answer.data, () => {});
      preview.disabled = false;
      if (done.status === "succeeded") {
        const audio = document.getElementById("preview-audio");
        await showAudio(done, audio, null, null);
        audio.play().catch(() => {});
      }
    });
  }

  /* History: running rows show their progress until they finish, then the page reloads. */
  function setupHistory() {
    const rows = document.querySelectorAll("tr[data-running]");
    rows.forEach((row) => {
      const bar = row.querySelector("progress");
      follow({ id: row.dataset.job, status: "running" }, (job) => {
        if (bar) bar.value = Math.round(job.progress * 100);
        const label = row.querySelector(".status-text");
        if (label) label.textContent = job.status;
      }).then(() => window.location.reload());
    });
    document.querySelectorAll("button[data-play]").forEach((button) => {
      button.addEventListener("click", () => {
        const audio = document.getElementById(button.dataset.play);
        audio.hidden = false;
        audio.play().catch(() => {});
      });
    });
  }

  function setupCopy() {
    document.querySelectorAll("button[data-copy]").forEach((button) => {
      button.addEventListener("click", async () => {
        const source = document.getElementById(button.dataset.copy);
        try {
          await navigator.clipboard.writeText(source.textContent.trim());
          button.textContent = "Copied";
        } catch (e) {
          const range = document.createRange();
          range.selectNodeContents(source);
          window.getSelection().removeAllRanges();
          window.getSelection().addRange(range);
          button.textContent = "Selected: press Ctrl+C";
        }
      });
    });
  }

  function setupConfirm() {
    document.querySelectorAll("form[data-confirm]").forEach((form) => {
      form.addEventListener("submit", (event) => {
        if (!window.confirm(form.dataset.confirm)) event.preventDefault();
      });
    });
  }


  /* The microphone: Record, Stop, Play back (MediaRecorder: WebM or Ogg with Opus, which the
     server's decoder takes by their first bytes). onRecorded gets a File of the recording. */
  const RECORDING_TYPES = ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm", "audio/ogg"];

  function setupRecorder(root, onRecorded) {
    const record = root.querySelector("[data-record]");
    const stop = root.querySelector("[data-stop]");
    const play = root.querySelector("[data-play]");
    const audio = root.querySelector("[data-playback]");
    const status = root.querySelector("[data-recorder-status]");
    let recorder = null, stream = null, chunks = [], started = 0, ticker = null;

    const say = (text) => { status.textContent = text; };
    const release = () => {
      if (stream) stream.getTracks().forEach((track) => track.stop()); // the microphone is free again
      stream = null;
      if (ticker) clearInterval(ticker);
      ticker = null;
    };

    record.addEventListener("click", async () => {
      if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia || !window.MediaRecorder) {
        say("This browser cannot record here: choose a file instead.");
        return;
      }
      record.disabled = true;
      try {
        // The raw signal: the server's checks, not the browser's noise suppression, judge it.
        stream = await navigator.mediaDevices.getUserMedia({
          audio: { echoCancellation: false, noiseSuppression: false, autoGainControl: false, channelCount: 1 },
        });
      } catch (e) {
        record.disabled = false;
        say(`The microphone is not available (${e.name || e}): allow it for this site, or choose a file.`);
        return;
      }
      const type = RECORDING_TYPES.find((t) => MediaRecorder.isTypeSupported(t)) || "";
      recorder = new MediaRecorder(stream, type ? { mimeType: type, audioBitsPerSecond: 64000 } : {});
      chunks = [];
      recorder.addEventListener("dataavailable", (event) => { if (event.data.size) chunks.push(event.data); });
      recorder.addEventListener("stop", async () => {
        release();
        const mime = (recorder.mimeType || type || "audio/webm").split(";")[0];
        const blob = new Blob(chunks, { type: mime });
        const file = new File([blob], `recording.${mime.endsWith("ogg") ? "ogg" : "webm"}`, { type: mime });
        if (audio.src) URL.revokeObjectURL(audio.src);
        audio.src = URL.createObjectURL(blob);
        audio.hidden = false;
        play.disabled = false;
        record.disabled = false;
        record.textContent = "Record again";
        root.dataset.state = "recorded";
        try {
          // A recorder's WebM carries no duration (the element says Infinity): the decoded one is shown.
          const context = new (window.AudioContext || window.webkitAudioContext)();
          const buffer = await context.decodeAudioData(await blob.arrayBuffer());
          audio.dataset.decodedDuration = String(buffer.duration);
          context.close();
          say(`Recorded ${formatSeconds(buffer.duration)}. Play it back, then submit, or record again.`);
        } catch (e) {
          say("Recorded. Play it back, then submit, or record again.");
        }
        play.focus();
        onRecorded(file);
      });
      recorder.start(250);
      started = Date.now();
      root.dataset.state = "recording";
      delete audio.dataset.decodedDuration;
      stop.disabled = false;
      play.disabled = true;
      stop.focus(); // Record is disabled now: the keyboard goes on from Stop
      say("Recording… press Stop when done.");
      ticker = setInterval(() => say(`Recording: ${formatSeconds((Date.now() - started) / 1000)}… press Stop when done.`), 1000);
    });

    stop.addEventListener("click", () => {
      if (!recorder || recorder.state === "inactive") return;
      stop.disabled = true;
      recorder.stop();
    });

    play.addEventListener("click", () => {
      audio.currentTime = 0;
      audio.play().catch(() => {});
    });
  }

  /* The voice upload: a recording from the microphone becomes the form's file. */
  function setupPromptRecorder() {
    const box = document.getElementById("prompt-recording");
    if (!box) return;
    const input = document.getElementById(box.dataset.fileInput);
    setupRecorder(box.querySelector("[data-recorder]"), (file) => {
      const transfer = new DataTransfer();
      transfer.items.add(file);
      input.files = transfer.files;
      input.dispatchEvent(new Event("change", { bubbles: true }));
    });
  }

  /* Voice consents: get a phrase, record it, submit; the server's refusal is shown as it says it. */
  const CONSENT_HINTS = {
    consent_mismatch: "We heard another code: read the phrase again, code included, and record once more.",
    consent_unclear: "Record again, closer to the microphone, in a quiet room.",
    consent_phrase_expired: "Get a new phrase and read that one.",
    consent_phrase_used: "Get a new phrase and read that one.",
  };

  function setupConsentForm() {
    const form = document.getElementById("consent-form");
    if (!form) return;
    const getPhrase = document.getElementById("get-phrase");
    const box = document.getElementById("phrase-box");
    const submit = document.getElementById("consent-submit");
    const language = document.getElementById("language");
    const attestField = document.getElementById("attest-field");
    let recording = null;

    const clear = () => {
      form.querySelectorAll(".error").forEach((el) => { el.hidden = true; el.textContent = ""; });
      form.querySelectorAll("[aria-invalid]").forEach((el) => el.removeAttribute("aria-invalid"));
    };
    const fail = (error) => {
      const field = ["name", "language", "attestation", "recording"].includes(error.field) ? error.field : null;
      const target = document.getElementById(`${field}-error`) || document.getElementById("form-error");
      const hint = CONSENT_HINTS[error.code];
      target.textContent = hint ? `${error.message} ${hint}` : error.message;
      target.hidden = false;
      const input = field && document.getElementById(field);
      if (input) { input.setAttribute("aria-invalid", "true"); input.focus(); }
      if (error.code === "consent_phrase_expired" || error.code === "consent_phrase_used") {
        box.hidden = true;
        getPhrase.focus();
      }
    };

    getPhrase.addEventListener("click", async () => {
      clear();
      getPhrase.disabled = true;
      const answer = await postJson(form.dataset.phraseUrl, { language: language.value });
      getPhrase.disabled = false;
      if (!answer.ok) { fail(problemOf(answer)); return; }
      const phrase = answer.data;
      document.getElementById("phrase").value = phrase.id;
      const text = document.getElementById("phrase-text");
      text.textContent = phrase.text;
      text.lang = phrase.checked ? phrase.language : "en";
      document.getElementById("phrase-code").textContent = phrase.code;
      const expiry = document.getElementById("phrase-expiry");
      expiry.dateTime = phrase.expires_at;
      expiry.textContent = new Date(phrase.expires_at).toLocaleTimeString();
      attestField.hidden = phrase.checked;
      box.hidden = false;
      getPhrase.textContent = "Get a new phrase";
      text.focus();
    });

    setupRecorder(form.querySelector("[data-recorder]"), (file) => {
      recording = file;
      submit.disabled = false;
    });

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      clear();
      if (!recording) { fail({ message: "Record the phrase first.", field: "recording" }); return; }
      const body = new FormData();
      body.append("name", document.getElementById("name").value);
      body.append("language", language.value);
      body.append("phrase", document.getElementById("phrase").value);
      const attestation = document.getElementById("attestation");
      if (attestation && attestation.checked && !attestField.hidden) body.append("attestation", "true");
      body.append("recording", recording, recording.name);
      submit.disabled = true;
      const status = form.querySelector("[data-recorder-status]");
      status.textContent = "Checking the recording…";
      let answer;
      try {
        const response = await fetch(form.dataset.recordUrl, {
          method: "POST", credentials: "same-origin", headers: { "X-CSRFToken": csrfToken() }, body: body,
        });
        let data = {};
        try { data = await response.json(); } catch (e) { data = {}; }
        answer = { ok: response.ok, status: response.status, data: data };
      } catch (e) {
        answer = { ok: false, status: 0, data: { detail: "The server could not be reached; try again." } };
      }
      submit.disabled = false;
      if (!answer.ok) { status.textContent = ""; fail(problemOf(answer)); return; }
      window.location.assign(form.dataset.doneUrl); // the list, with the new consent and a message
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    setupSynthesize();
    setupHistory();
    setupCopy();
    setupConfirm();
    setupPromptRecorder();
    setupConsentForm();
  });
})();
