// Images attached to the next message of the chat page: chosen with the file picker or pasted
// into the prompt, shown as thumbnails (blob: URLs: the page's policy lets images load from
// them, and from nothing else but the server), and sent as OpenAI image_url parts holding
// data: URLs, which the server decodes itself (it fetches no URL the page could name).

import {el} from "./render.js";

const TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];

function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

// One image as the conversation shows it.
export function thumbnail(item) {
  const img = el("img", "thumb");
  img.src = item.view;
  img.alt = item.name;
  img.title = item.name;
  return img;
}

// The OpenAI content parts of a message: its images, then its text (a plain string without
// images, as before).
export function messageContent(text, images) {
  if (!images.length) return text;
  const parts = images.map((item) => ({type: "image_url", image_url: {url: item.url}}));
  return text.trim() ? [...parts, {type: "text", text}] : parts;
}

export class Attachments {
  constructor(tray, onError) {
    this.tray = tray;
    this.onError = onError;
    this.items = [];
  }

  // Files from the picker or the clipboard; anything but an image is refused by name.
  async add(files) {
    for (const file of files) {
      if (!TYPES.includes(file.type)) {
        this.onError(`${file.name || "the pasted file"}: not an image the model takes ` +
          "(PNG, JPEG, GIF or WebP).");
        continue;
      }
      const name = file.name || "pasted image";
      this.items.push({name, url: await dataUrl(file), view: URL.createObjectURL(file)});
    }
    this.render();
  }

  // The clipboard's images, when a paste holds any (then only they are taken).
  paste(event) {
    const files = Array.from(event.clipboardData ? event.clipboardData.files : [])
      .filter((file) => file.type.startsWith("image/"));
    if (!files.length) return false;
    event.preventDefault();
    this.add(files);
    return true;
  }

  render() {
    this.tray.replaceChildren(...this.items.map((item, i) => {
      const chip = el("span", "attachment");
      const remove = el("button", "remove", "×");
      remove.type = "button";
      remove.title = `Remove ${item.name}`;
      remove.addEventListener("click", () => {
        URL.revokeObjectURL(item.view);
        this.items.splice(i, 1);
        this.render();
      });
      chip.append(thumbnail(item), remove);
      return chip;
    }));
    this.tray.hidden = !this.items.length;
  }

  // The attached images, handed to a message (the tray empties); back if it is not sent.
  take() {
    const items = this.items;
    this.items = [];
    this.render();
    return items;
  }

  restore(items) {
    this.items = [...items, ...this.items];
    this.render();
  }

  clear() {
    this.items = [];
    this.render();
  }
}
